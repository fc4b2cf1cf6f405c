//! Source: where desired state comes from. `git` fetches a repository and
//! reads the files at a revision; `render` turns those files into manifests;
//! `repo_url` normalizes repository URLs, for the mirrors and for matching
//! webhooks and commit statuses to Applications.

pub mod git;
pub mod render;
pub mod repo_url;
