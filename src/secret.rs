//! Secrets in settings and options: values that `Debug` and `Display` never
//! print, so a struct that holds one can derive `Debug` and still be logged.
//! A repository URL is shown by [`ShownUrl`], without its user info.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// What a secret prints as, everywhere.
pub const REDACTED: &str = "<redacted>";

/// A password, token or URL with a password in it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that sends or compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// For clap: `--github-token TOKEN` parses into a `Secret`.
impl FromStr for Secret {
    type Err = Infallible;
    fn from_str(value: &str) -> Result<Self, Infallible> {
        Ok(Secret::new(value))
    }
}

/// A repository URL in `Debug` output: without its user info (a password,
/// a token), as Git errors and log lines show it.
pub struct ShownUrl<'a>(pub &'a str);

impl fmt::Debug for ShownUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&crate::source::repo_url::display_url(self.0), f)
    }
}

#[cfg(test)]
mod tests {
    //! Every struct that holds a secret, printed with `{:?}`: the secret is
    //! not there.

    use super::*;
    use clap::Parser;

    const PASSWORD: &str = "s3cr3t-pass";
    const URL: &str = "https://bot:s3cr3t-pass@git.example.com/org/repo.git";

    fn assert_hidden(debug: &str) {
        assert!(!debug.contains(PASSWORD), "{debug}");
        assert!(!debug.contains("bot:"), "{debug}");
    }

    #[test]
    fn a_secret_prints_as_redacted_and_keeps_its_value() {
        let secret: Secret = PASSWORD.parse().unwrap();
        assert_eq!(format!("{secret:?} {secret}"), "<redacted> <redacted>");
        assert_eq!(secret.expose(), PASSWORD);
    }

    #[test]
    fn the_command_line_and_serve_options_print_no_secret() {
        for role in ["run", "webhook", "worker", "watch", "sweep"] {
            let cli = crate::cli::Cli::try_parse_from([
                "setpoint",
                role,
                "--amqp-url",
                "amqp://setpoint:s3cr3t-pass@mq:5672/%2f",
                "--github-secret",
                "s3cr3t-pass,s3cr3t-pass-2",
                "--gitlab-token",
                PASSWORD,
                "--github-token",
                PASSWORD,
            ])
            .expect("the options parse");
            assert_hidden(&format!("{cli:?}"));
            assert_hidden(&format!("{cli:#?}"));
            let (crate::cli::Command::Run(options)
            | crate::cli::Command::Webhook(options)
            | crate::cli::Command::Worker(options)
            | crate::cli::Command::Watch(options)
            | crate::cli::Command::Sweep(options)) = cli.command
            else {
                unreachable!("a serving role")
            };
            assert_eq!(options.github_secret.len(), 2);
            assert_eq!(
                options.github_token.as_ref().map(Secret::expose),
                Some(PASSWORD)
            );
            assert_hidden(&format!("{options:?}"));
        }
    }

    #[test]
    fn settings_built_from_the_options_print_no_secret() {
        let webhook = crate::ingest::webhook::WebhookSettings {
            github_secrets: vec![PASSWORD.into()],
            gitlab_tokens: vec![PASSWORD.into()],
            ..Default::default()
        };
        let github = crate::report::github::GitHubSettings {
            token: PASSWORD.into(),
            ..Default::default()
        };
        let amqp = crate::queue::amqp::AmqpSettings {
            url: format!("amqp://setpoint:{PASSWORD}@mq:5672/%2f"),
            ..Default::default()
        };
        let credentials = crate::source::git::Credentials {
            username: "bot".into(),
            password: PASSWORD.into(),
        };
        for debug in [
            format!("{webhook:?}"),
            format!("{github:?}"),
            format!("{amqp:?}"),
            format!("{credentials:?}"),
        ] {
            assert!(!debug.contains(PASSWORD), "{debug}");
        }
    }

    #[test]
    fn structs_holding_a_repository_url_print_it_without_user_info() {
        let source = crate::api::Source {
            repo_url: URL.into(),
            ..Default::default()
        };
        let app = crate::api::Application::new(
            "web",
            crate::api::ApplicationSpec {
                source: source.clone(),
                ..Default::default()
            },
        );
        let app_source = crate::ingest::webhook::AppSource {
            key: crate::event::AppKey {
                namespace: "team".into(),
                name: "web".into(),
            },
            repo_url: URL.into(),
            target_revision: None,
            path: None,
            inputs: vec![],
        };
        let request = crate::source::git::CheckoutRequest {
            url: URL,
            ..Default::default()
        };
        let job = crate::source::render::Job {
            method: &crate::source::render::Method::Kustomize,
            repo_url: URL,
            mirror: std::path::Path::new("/cache/mirror"),
            commit: "0123",
            path: "",
            namespace: "team",
            app: "web",
            capabilities: None,
        };
        for debug in [
            format!("{source:?}"),
            format!("{app:?}"),
            format!("{app_source:?}"),
            format!("{request:?}"),
            format!("{job:?}"),
        ] {
            assert_hidden(&debug);
            assert!(
                debug.contains("https://git.example.com/org/repo.git"),
                "{debug}"
            );
        }
        assert_eq!(
            format!("{:?}", ShownUrl("git@github.com:org/repo")),
            "\"git@github.com:org/repo\""
        );
    }
}
