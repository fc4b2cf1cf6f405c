//! Source: where desired state comes from. `git` fetches a repository and
//! reads the files at a revision; `chart` fetches a Helm chart from a Helm
//! repository or an OCI registry; `render` turns those files into
//! manifests; `repo_url` normalizes repository URLs, for the mirrors and for
//! matching webhooks and commit statuses to Applications.

pub mod chart;
pub mod git;
pub mod render;
pub mod repo_url;
