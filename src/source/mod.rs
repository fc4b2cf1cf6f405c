//! Source: where desired state comes from. `git` fetches a repository and
//! reads the files at a revision; `render` turns those files into manifests.

pub mod git;
pub mod render;
