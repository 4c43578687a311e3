//! Who owns a node-local directory the worker uses: the user a container
//! runs as ([`Owner`], rendered `UID:GID` on the command line and in pod
//! security contexts) and what the worker will do there ([`Purpose`]).
//! The operator renders them and the stager's `prepare` acts on them.

/// What a worker will do in a directory `ferry-stager prepare` readies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Purpose {
    /// Write into it: every entry becomes the worker's, every directory readable by all.
    Pull,
    /// Read from it and keep its push state in `.ferry`: only that becomes the worker's.
    Push,
}

/// A numeric user and group, written `UID:GID`: who a container runs as
/// and who owns what it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

impl std::str::FromStr for Owner {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (uid, gid) = text.split_once(':').ok_or_else(|| format!("'{text}' is not UID:GID"))?;
        let number = |what: &str, value: &str| {
            value.parse::<u32>().map_err(|_| format!("'{value}' in '{text}' is not a numeric {what} id"))
        };
        Ok(Self { uid: number("user", uid)?, gid: number("group", gid)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_two_numeric_ids() {
        assert_eq!("65532:65532".parse::<Owner>(), Ok(Owner { uid: 65532, gid: 65532 }));
        assert_eq!(Owner { uid: 0, gid: 1000 }.to_string(), "0:1000");
        assert!("65532".parse::<Owner>().unwrap_err().contains("not UID:GID"));
        assert!("nonroot:1".parse::<Owner>().unwrap_err().contains("numeric user id"));
        assert!("1:-1".parse::<Owner>().unwrap_err().contains("numeric group id"));
    }
}
