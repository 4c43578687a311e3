//! The stager's exit codes: what a finished process tells its supervisor
//! (a Job's pod failure policy, a shell script) without reading its output.

/// How a stager process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// Every selected object is in place and verified.
    Success,
    /// The run finished, but some objects failed or were refused.
    Incomplete,
    /// The command line is wrong.
    Usage,
    /// The run could not proceed (endpoint unreachable, destination
    /// unusable); another attempt might.
    RunFailed,
    /// The run could not proceed and another attempt without a change
    /// cannot help (bucket missing, credentials refused, bad configuration).
    RunRefused,
}

impl ExitStatus {
    /// Every status.
    pub const ALL: [ExitStatus; 5] =
        [ExitStatus::Success, ExitStatus::Incomplete, ExitStatus::Usage, ExitStatus::RunFailed, ExitStatus::RunRefused];

    /// The process exit code.
    pub const fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Incomplete => 1,
            ExitStatus::Usage => 2,
            ExitStatus::RunFailed => 3,
            ExitStatus::RunRefused => 4,
        }
    }

    /// The status of an exit code, if it is one of the stager's.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| i32::from(s.code()) == code)
    }

    /// Whether running again without a change cannot help, so a
    /// supervisor should give up at once instead of retrying.
    pub const fn is_permanent(self) -> bool {
        matches!(self, ExitStatus::Usage | ExitStatus::RunRefused)
    }

    /// The exit codes after which a supervisor should not retry.
    pub fn permanent_codes() -> Vec<i32> {
        Self::ALL.into_iter().filter(|s| s.is_permanent()).map(|s| i32::from(s.code())).collect()
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        std::process::ExitCode::from(status.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_only_usage_and_refusal_are_permanent() {
        for status in ExitStatus::ALL {
            assert_eq!(ExitStatus::from_code(i32::from(status.code())), Some(status));
        }
        assert_eq!(ExitStatus::from_code(137), None);
        assert_eq!(ExitStatus::permanent_codes(), [2, 4]);
    }
}
