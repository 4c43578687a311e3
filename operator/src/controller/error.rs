//! What can stop one reconciliation, and the category it is counted and
//! reported under.

/// Errors of one reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object under a name the operator makes belongs to another
    /// DataStage (its labels say so); the reconciliation waits for it to go.
    #[error("{0} exists and was made for another DataStage")]
    Taken(String),
}

impl From<crate::delivery::DeliveryError> for Error {
    fn from(error: crate::delivery::DeliveryError) -> Self {
        match error {
            crate::delivery::DeliveryError::Kube(error) => Error::Kube(error),
        }
    }
}

impl Error {
    /// A static category for metrics and events: the API's status reason
    /// where there is one (a `Forbidden` says the RBAC is short), else
    /// whether the API server could be reached at all. Always one of
    /// [`crate::metrics::RECONCILE_ERROR_REASONS`].
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) => match status.code {
                401 => "Unauthorized",
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                422 => "Invalid",
                429 => "TooManyRequests",
                500..=599 => "ServerError",
                _ => "KubeApi",
            },
            Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => "Unreachable",
            Error::Kube(_) => "KubeApi",
            Error::Taken(_) => "Conflict",
        }
    }
}
