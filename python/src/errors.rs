//! Python exceptions for the engine's failures: one class per
//! [`Reason`] (the same words the stager's summary and the operator's
//! conditions use), all subclasses of `ferry.FerryError`, each instance
//! carrying `reason` and `message`.

use ferry_contract::Reason;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyModule;

pyo3::create_exception!(ferry, FerryError, PyException, "A transfer failed; `reason` says why in one word.");
pyo3::create_exception!(ferry, BucketNotFound, FerryError, "The bucket does not exist.");
pyo3::create_exception!(ferry, ObjectNotFound, FerryError, "The object does not exist.");
pyo3::create_exception!(ferry, AccessDenied, FerryError, "The store refused the credentials or the request.");
pyo3::create_exception!(ferry, NoCredentials, FerryError, "No credentials could be found.");
pyo3::create_exception!(ferry, ObjectChanged, FerryError, "An object changed while it was copied.");
pyo3::create_exception!(ferry, EndpointUnreachable, FerryError, "The endpoint could not be reached or timed out.");
pyo3::create_exception!(ferry, StoreUnavailable, FerryError, "The store answered with errors that may pass.");
pyo3::create_exception!(ferry, StoreRejected, FerryError, "The store rejected a request for good.");
pyo3::create_exception!(ferry, DestinationUnusable, FerryError, "The local destination cannot be prepared or written.");
pyo3::create_exception!(
    ferry,
    InsufficientCapacity,
    FerryError,
    "The destination filesystem has no room for the data."
);
pyo3::create_exception!(
    ferry,
    QuotaExceeded,
    FerryError,
    "The dataset holds more bytes than its quota (dataset_quota) allows."
);
pyo3::create_exception!(ferry, SourceUnreadable, FerryError, "The local source cannot be read.");
pyo3::create_exception!(ferry, SourceEmpty, FerryError, "The local source holds no file to push.");
pyo3::create_exception!(ferry, InvalidConfiguration, FerryError, "The options do not make sense together.");
pyo3::create_exception!(ferry, ChecksumMismatch, FerryError, "The bytes read did not match the store's checksum.");
pyo3::create_exception!(ferry, UnknownReason, FerryError, "A failure this build has no name for.");
pyo3::create_exception!(
    ferry,
    TransferIncomplete,
    FerryError,
    "A pull or push finished with some objects failed; `summary` lists them."
);

/// The exception for `reason` with `message`, its `reason` and `message`
/// attributes set.
pub fn error(py: Python<'_>, reason: Reason, message: String) -> PyErr {
    let error = match reason {
        Reason::BucketNotFound => BucketNotFound::new_err(message.clone()),
        Reason::ObjectNotFound => ObjectNotFound::new_err(message.clone()),
        Reason::AccessDenied => AccessDenied::new_err(message.clone()),
        Reason::NoCredentials => NoCredentials::new_err(message.clone()),
        Reason::ObjectChanged => ObjectChanged::new_err(message.clone()),
        Reason::EndpointUnreachable => EndpointUnreachable::new_err(message.clone()),
        Reason::StoreUnavailable => StoreUnavailable::new_err(message.clone()),
        Reason::StoreRejected => StoreRejected::new_err(message.clone()),
        Reason::DestinationUnusable => DestinationUnusable::new_err(message.clone()),
        Reason::InsufficientCapacity => InsufficientCapacity::new_err(message.clone()),
        Reason::QuotaExceeded => QuotaExceeded::new_err(message.clone()),
        Reason::SourceUnreadable => SourceUnreadable::new_err(message.clone()),
        Reason::SourceEmpty => SourceEmpty::new_err(message.clone()),
        Reason::InvalidConfiguration => InvalidConfiguration::new_err(message.clone()),
        Reason::ChecksumMismatch => ChecksumMismatch::new_err(message.clone()),
        Reason::Unknown => UnknownReason::new_err(message.clone()),
    };
    annotate(py, &error, reason.as_str(), message);
    error
}

/// A pull or push that finished with failed objects; `summary_json` is the
/// run's summary, which the Python layer exposes as `error.summary`.
pub fn incomplete(py: Python<'_>, message: String, summary_json: String) -> PyErr {
    let error = TransferIncomplete::new_err(message.clone());
    annotate(py, &error, "TransferIncomplete", message);
    let _ = error.value(py).setattr("summary_json", summary_json);
    error
}

fn annotate(py: Python<'_>, error: &PyErr, reason: &str, message: String) {
    let value = error.value(py);
    // Setting attributes on a fresh exception instance cannot fail.
    let _ = value.setattr("reason", reason);
    let _ = value.setattr("message", message);
}

/// Adds every exception class to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("FerryError", py.get_type::<FerryError>())?;
    module.add("BucketNotFound", py.get_type::<BucketNotFound>())?;
    module.add("ObjectNotFound", py.get_type::<ObjectNotFound>())?;
    module.add("AccessDenied", py.get_type::<AccessDenied>())?;
    module.add("NoCredentials", py.get_type::<NoCredentials>())?;
    module.add("ObjectChanged", py.get_type::<ObjectChanged>())?;
    module.add("EndpointUnreachable", py.get_type::<EndpointUnreachable>())?;
    module.add("StoreUnavailable", py.get_type::<StoreUnavailable>())?;
    module.add("StoreRejected", py.get_type::<StoreRejected>())?;
    module.add("DestinationUnusable", py.get_type::<DestinationUnusable>())?;
    module.add("InsufficientCapacity", py.get_type::<InsufficientCapacity>())?;
    module.add("QuotaExceeded", py.get_type::<QuotaExceeded>())?;
    module.add("SourceUnreadable", py.get_type::<SourceUnreadable>())?;
    module.add("SourceEmpty", py.get_type::<SourceEmpty>())?;
    module.add("InvalidConfiguration", py.get_type::<InvalidConfiguration>())?;
    module.add("ChecksumMismatch", py.get_type::<ChecksumMismatch>())?;
    module.add("UnknownReason", py.get_type::<UnknownReason>())?;
    module.add("TransferIncomplete", py.get_type::<TransferIncomplete>())?;
    Ok(())
}
