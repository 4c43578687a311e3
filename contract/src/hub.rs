//! Hugging Face Hub repositories as `hf://` locations name them:
//! `hf://ORG/REPO` (a model), `hf://datasets/ORG/REPO`,
//! `hf://spaces/ORG/REPO`, each with an optional `@REVISION` (a branch, a
//! tag or a commit) after the repository and an optional path inside it
//! after that: `hf://datasets/acme/corpus@v2/train`.
//!
//! A [`HubRepo`] is the "bucket" of such a location (what a store is
//! connected to); the path is its prefix. The location parser and the Hub
//! store both read it through this one type, so the spelling of the kind
//! prefixes and of a revision lives here alone. A revision with a `/`
//! (`refs/pr/1`) is written `refs%2Fpr%2F1`, as the Hub's own file system
//! writes it, since a `/` after the revision starts the path.

use std::fmt;
use std::str::FromStr;

/// What kind of repository, which decides its URLs on the Hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RepoKind {
    /// A model: `hf://ORG/REPO` (or `hf://models/ORG/REPO`).
    Model,
    /// A dataset: `hf://datasets/ORG/REPO`.
    Dataset,
    /// A Space: `hf://spaces/ORG/REPO`.
    Space,
}

impl RepoKind {
    /// The plural the Hub's API paths use (`/api/models/…`), which is also
    /// the location's prefix for the kind.
    pub fn plural(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
            RepoKind::Space => "spaces",
        }
    }

    /// What goes before `ORG/REPO` in a file's URL (`/datasets/ORG/REPO/resolve/…`):
    /// nothing for a model.
    pub fn url_prefix(self) -> &'static str {
        match self {
            RepoKind::Model => "",
            RepoKind::Dataset => "datasets/",
            RepoKind::Space => "spaces/",
        }
    }
}

/// One repository on the Hub, at a revision.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HubRepo {
    /// Model, dataset or Space.
    pub kind: RepoKind,
    /// `ORG/REPO`.
    pub id: String,
    /// The branch, tag or commit named; `None` for the default branch.
    pub revision: Option<String>,
}

/// The branch a repository is read at when no revision is named.
pub const DEFAULT_REVISION: &str = "main";

/// The environment variable that holds a Hub access token, as the Hub's own
/// client reads it; also the key of a DataStage's credentials Secret that
/// the operator hands to workers.
pub const HF_TOKEN_ENV: &str = "HF_TOKEN";

/// The environment variable that names another Hub (a mirror, a private
/// hub) instead of [`DEFAULT_ENDPOINT`], as the Hub's own client reads it.
pub const HF_ENDPOINT_ENV: &str = "HF_ENDPOINT";

/// The Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

impl HubRepo {
    /// The revision to resolve: the one named, or [`DEFAULT_REVISION`].
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// Whether the revision names a commit (40 hex digits), which never moves.
    pub fn is_commit(&self) -> bool {
        self.revision.as_deref().is_some_and(is_commit_id)
    }
}

/// Whether `text` is a full git commit id.
pub fn is_commit_id(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// An `hf://` location that does not name a repository.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{text}' is no Hub repository: {reason}")]
pub struct InvalidHubRepo {
    text: String,
    reason: &'static str,
}

/// The part of an `hf://` URI after the scheme, split into the repository
/// and the path inside it (empty, or without slashes at either end).
///
/// # Errors
/// No `ORG/REPO`, names the Hub does not allow, or an empty revision.
pub fn split_location(rest: &str) -> Result<(HubRepo, String), InvalidHubRepo> {
    let err = |reason| InvalidHubRepo { text: rest.to_owned(), reason };
    let (kind, rest) = match rest.split_once('/') {
        Some(("models", rest)) => (RepoKind::Model, rest),
        Some(("datasets", rest)) => (RepoKind::Dataset, rest),
        Some(("spaces", rest)) => (RepoKind::Space, rest),
        _ => (RepoKind::Model, rest),
    };
    let mut segments = rest.splitn(3, '/');
    let org = segments.next().unwrap_or_default();
    let name_and_revision = segments.next().ok_or_else(|| err("expected ORG/REPO[@REVISION][/PATH]"))?;
    let path = segments.next().unwrap_or_default().trim_matches('/');
    let (name, revision) = match name_and_revision.split_once('@') {
        Some((name, revision)) => (name, Some(revision)),
        None => (name_and_revision, None),
    };
    if !is_repo_name(org) || !is_repo_name(name) {
        return Err(err(
            "ORG and REPO are letters, digits, '-', '_' and '.', not starting or ending with '-' or '.', without '--' or '..', at most 96 characters",
        ));
    }
    let revision = match revision {
        None => None,
        Some("") => return Err(err("the revision after '@' is empty")),
        Some(revision) => {
            let decoded = revision.replace("%2F", "/").replace("%2f", "/");
            if decoded.split('/').any(|part| part.is_empty() || part == "." || part == "..")
                || decoded.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'%' || b == b'?' || b == b'#')
            {
                return Err(err("the revision is no branch, tag or commit name"));
            }
            Some(decoded)
        }
    };
    Ok((HubRepo { kind, id: format!("{org}/{name}"), revision }, path.to_owned()))
}

/// The Hub's rule for an organisation's or a repository's name.
fn is_repo_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 96
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.'])
        && !name.contains("--")
        && !name.contains("..")
}

impl FromStr for HubRepo {
    type Err = InvalidHubRepo;

    /// A repository without a path: what [`fmt::Display`] writes.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match split_location(text)? {
            (repo, path) if path.is_empty() => Ok(repo),
            _ => Err(InvalidHubRepo { text: text.to_owned(), reason: "a repository, not a path inside one" }),
        }
    }
}

impl fmt::Display for HubRepo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.kind.url_prefix(), self.id)?;
        if let Some(revision) = &self.revision {
            write!(f, "@{}", revision.replace('/', "%2F"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_split_into_a_repository_and_a_path() {
        let (repo, path) = split_location("acme/tiny").unwrap();
        assert_eq!(
            (repo.kind, repo.id.as_str(), repo.revision(), path.as_str()),
            (RepoKind::Model, "acme/tiny", "main", "")
        );
        let (repo, path) = split_location("datasets/acme/corpus@v2/train/shards/").unwrap();
        assert_eq!(
            (repo.kind, repo.id.as_str(), repo.revision.as_deref(), path.as_str()),
            (RepoKind::Dataset, "acme/corpus", Some("v2"), "train/shards")
        );
        let (repo, _) = split_location("spaces/acme/demo@refs%2Fpr%2F1").unwrap();
        assert_eq!((repo.kind, repo.revision()), (RepoKind::Space, "refs/pr/1"));
        assert_eq!(repo.to_string(), "spaces/acme/demo@refs%2Fpr%2F1");
        let (repo, path) = split_location("models/acme/tiny/config.json").unwrap();
        assert_eq!((repo.to_string().as_str(), path.as_str()), ("acme/tiny", "config.json"));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let pinned: HubRepo = format!("acme/tiny@{commit}").parse().unwrap();
        assert!(pinned.is_commit() && !split_location("acme/tiny@main").unwrap().0.is_commit());
    }

    #[test]
    fn every_repository_reads_back_as_written() {
        for text in ["acme/tiny", "datasets/acme/c.v1@main", "spaces/a-b/c_d@refs%2Fconvert%2Fparquet", "acme/x@v1.0"] {
            let repo: HubRepo = text.parse().unwrap();
            assert_eq!(repo.to_string(), text);
            assert_eq!(repo.to_string().parse::<HubRepo>().unwrap(), repo);
        }
    }

    #[test]
    fn names_the_hub_refuses_are_refused() {
        for bad in [
            "acme",
            "acme/",
            "/tiny",
            "datasets/acme",
            "acme/-tiny",
            "acme/ti--ny",
            "acme/ti..ny",
            "ac me/tiny",
            "acme/tiny@",
            "acme/tiny@..",
            "acme/tiny@a%2F%2Fb",
            "acme/tiny@a b",
            &format!("acme/{}", "x".repeat(97)),
        ] {
            assert!(split_location(bad).is_err(), "{bad}");
        }
        assert!("acme/tiny/config.json".parse::<HubRepo>().is_err(), "a path is no repository");
    }
}
