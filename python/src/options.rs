//! Keyword arguments to [`TransferOptions`]: the `ferry-stager` flags with
//! dashes as underscores (`--part-size` is `part_size=`), parsed into the
//! same type, so the engine cannot tell a Python call from a command line.
//! Sizes take an int (bytes) or a string (`"16MiB"`); durations take
//! seconds (int or float). A name that is not an option is a `TypeError`,
//! a value that does not parse a `ValueError`; both name the argument.

use std::time::Duration;

use ferry_contract::options::{Concurrency, MAX_CONCURRENCY, Shard, TransferOptions, VerifyMode, WebIdentityOptions};
use ferry_contract::size::{ByteSize, CapacityReserve};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Options of the CLI that make no sense in-process: they write files or
/// report to Kubernetes on the CLI's behalf.
/// `peers` stands for the `--peer-*` flags: fleet staging is between worker pods;
/// `capacity_claimed` is what the operator tells a worker of others on its node;
/// `versions` builds and switches trees with the stager's `switch` (not in-process yet).
const CLI_ONLY: [&str; 9] = [
    "metrics_addr",
    "summary_file",
    "termination_log",
    "report_to",
    "worker",
    "node_name",
    "peers",
    "capacity_claimed",
    "versions",
];

/// Every keyword argument a call takes besides its positionals.
pub const NAMES: [&str; 28] = [
    "endpoint_url",
    "anonymous",
    "region",
    "web_identity_token_file",
    "role_arn",
    "sts_endpoint",
    "role_session_name",
    "concurrency",
    "part_size",
    "multipart_threshold",
    "include",
    "exclude",
    "shard",
    "shards",
    "verify",
    "memory_limit",
    "write_buffer",
    "delete_removed",
    "capacity_reserve",
    "no_capacity_check",
    "dataset_quota",
    "shared_objects",
    "max_bandwidth",
    "max_request_rate",
    "max_attempts",
    "connect_timeout",
    "request_timeout",
    "stall_timeout",
];

/// Parses keyword arguments over the CLI's defaults.
///
/// # Errors
/// `TypeError` for an unknown name or a value of the wrong type,
/// `ValueError` for a value that does not parse.
pub fn parse(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<TransferOptions> {
    // The web identity comes from the environment unless an argument says
    // otherwise, as the CLI's does: a pod wired by EKS's webhook needs neither.
    let mut options = TransferOptions { web_identity: WebIdentityOptions::from_env(), ..TransferOptions::default() };
    let Some(kwargs) = kwargs else { return Ok(options) };
    for (name, value) in kwargs.iter() {
        let name: String = name.extract()?;
        let o = &mut options;
        match name.as_str() {
            "endpoint_url" => o.endpoint_url = optional(&name, &value)?,
            "anonymous" => o.anonymous = typed(&name, &value)?,
            "region" => o.region = optional(&name, &value)?,
            "web_identity_token_file" => {
                o.web_identity.web_identity_token_file = optional(&name, &value)?.map(Into::into);
            }
            "role_arn" => o.web_identity.role_arn = optional(&name, &value)?,
            "sts_endpoint" => o.web_identity.sts_endpoint = optional(&name, &value)?,
            "role_session_name" => o.web_identity.role_session_name = optional(&name, &value)?,
            "concurrency" => o.concurrency = concurrency(&name, &value)?,
            "part_size" => o.part_size = optional_size(&name, &value)?,
            "multipart_threshold" => o.multipart_threshold = optional_size(&name, &value)?,
            "include" => o.include = globs(&name, &value)?,
            "exclude" => o.exclude = globs(&name, &value)?,
            "shard" => o.shard = optional_parsed::<Shard>(&name, &value)?,
            "shards" => o.shards = if value.is_none() { None } else { Some(ranged(&name, &value, 1, 1000)?) },
            "verify" => o.verify = verify(&name, &value)?,
            "memory_limit" => o.memory_limit = size(&name, &value)?,
            "write_buffer" => o.write_buffer = size(&name, &value)?,
            "delete_removed" => o.delete_removed = typed(&name, &value)?,
            "capacity_reserve" => o.capacity_reserve = reserve(&name, &value)?,
            "no_capacity_check" => o.no_capacity_check = typed(&name, &value)?,
            "dataset_quota" => o.dataset_quota = optional_size(&name, &value)?,
            "shared_objects" => o.shared_objects = optional(&name, &value)?.map(Into::into),
            "max_bandwidth" => o.max_bandwidth = optional_size(&name, &value)?,
            "max_request_rate" => {
                o.max_request_rate = if value.is_none() { None } else { Some(ranged(&name, &value, 1, u32::MAX)?) }
            }
            "max_attempts" => o.max_attempts = ranged(&name, &value, 1, 100)?,
            "connect_timeout" => o.connect_timeout = seconds(&name, &value)?,
            "request_timeout" => o.request_timeout = seconds(&name, &value)?,
            "stall_timeout" => o.stall_timeout = seconds(&name, &value)?,
            cli if CLI_ONLY.contains(&cli) => {
                return Err(PyTypeError::new_err(format!(
                    "{cli} is a ferry-stager command-line option with no meaning in-process"
                )));
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument '{other}'; the options are: {}",
                    NAMES.join(", ")
                )));
            }
        }
    }
    Ok(options)
}

/// Names every field of [`TransferOptions`] without `..`: an option added
/// to the command line fails to compile here until it is either parsed
/// above or listed in [`CLI_ONLY`].
#[allow(dead_code)]
fn every_option_is_considered(options: TransferOptions) {
    let TransferOptions {
        endpoint_url: _,
        anonymous: _,
        region: _,
        web_identity:
            WebIdentityOptions { web_identity_token_file: _, role_arn: _, sts_endpoint: _, role_session_name: _ },
        concurrency: _,
        part_size: _,
        multipart_threshold: _,
        include: _,
        exclude: _,
        shard: _,
        shards: _,
        verify: _,
        memory_limit: _,
        write_buffer: _,
        delete_removed: _,
        versions: _,
        capacity_reserve: _,
        no_capacity_check: _,
        dataset_quota: _,
        capacity_claimed: _,
        shared_objects: _,
        metrics_addr: _,
        summary_file: _,
        termination_log: _,
        max_bandwidth: _,
        max_request_rate: _,
        store_share: _,
        report_to: _,
        worker: _,
        node_name: _,
        max_attempts: _,
        connect_timeout: _,
        request_timeout: _,
        stall_timeout: _,
        peers: _,
    } = options;
}

fn type_error(name: &str, expected: &str, value: &Bound<'_, PyAny>) -> PyErr {
    let got = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    PyTypeError::new_err(format!("{name}: expected {expected}, got {got}"))
}

fn typed<'a, 'py, T: FromPyObject<'a, 'py>>(name: &str, value: &'a Bound<'py, PyAny>) -> PyResult<T> {
    value.extract::<T>().map_err(|_| type_error(name, std::any::type_name::<T>(), value))
}

fn optional(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        Ok(None)
    } else {
        value.extract::<String>().map(Some).map_err(|_| type_error(name, "str", value))
    }
}

fn ranged(name: &str, value: &Bound<'_, PyAny>, low: u32, high: u32) -> PyResult<u32> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(type_error(name, "int", value));
    }
    let number: i64 = value.extract().map_err(|_| type_error(name, "int", value))?;
    u32::try_from(number)
        .ok()
        .filter(|n| (low..=high).contains(n))
        .ok_or_else(|| PyValueError::new_err(format!("{name}: {number} is not in {low}..={high}")))
}

/// `None` or `"auto"` adapts; an int pins the number of requests in flight.
fn concurrency(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Concurrency> {
    if value.is_none() {
        return Ok(Concurrency::Adaptive);
    }
    if let Ok(text) = value.extract::<String>() {
        return parsed(name, &text);
    }
    ranged(name, value, 1, MAX_CONCURRENCY).map(Concurrency::Fixed).map_err(|e| {
        if e.is_instance_of::<PyTypeError>(value.py()) { type_error(name, "int, 'auto' or None", value) } else { e }
    })
}

fn parsed<T: std::str::FromStr>(name: &str, text: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

fn optional_parsed<T: std::str::FromStr>(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<T>>
where
    T::Err: std::fmt::Display,
{
    match optional(name, value)? {
        None => Ok(None),
        Some(text) => parsed(name, &text).map(Some),
    }
}

fn size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<ByteSize> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(type_error(name, "int or str", value));
    }
    if let Ok(bytes) = value.extract::<i64>() {
        let bytes = u64::try_from(bytes).map_err(|_| PyValueError::new_err(format!("{name}: {bytes} is negative")))?;
        return ByteSize::from_bytes(bytes).map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
    }
    let text: String = value.extract().map_err(|_| type_error(name, "int or str", value))?;
    parsed(name, &text)
}

/// A reserve as bytes (an int, 0 for none) or as text: a size or a
/// percentage of the volume (`"10%"`).
fn reserve(name: &str, value: &Bound<'_, PyAny>) -> PyResult<CapacityReserve> {
    if let Ok(text) = value.extract::<String>() {
        return parsed(name, &text);
    }
    if !value.is_instance_of::<pyo3::types::PyBool>() && value.extract::<i64>().is_ok_and(|bytes| bytes == 0) {
        return Ok(CapacityReserve::Size(None));
    }
    size(name, value).map(|size| CapacityReserve::Size(Some(size)))
}

fn optional_size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<ByteSize>> {
    if value.is_none() { Ok(None) } else { size(name, value).map(Some) }
}

fn globs(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(one) = value.extract::<String>() {
        return Ok(vec![one]);
    }
    value.extract::<Vec<String>>().map_err(|_| type_error(name, "str or list of str", value))
}

fn verify(name: &str, value: &Bound<'_, PyAny>) -> PyResult<VerifyMode> {
    let text: String = value.extract().map_err(|_| type_error(name, "str", value))?;
    match text.to_ascii_lowercase().as_str() {
        "none" => Ok(VerifyMode::None),
        "size" => Ok(VerifyMode::Size),
        "checksum" => Ok(VerifyMode::Checksum),
        _ => Err(PyValueError::new_err(format!("{name}: expected 'none', 'size' or 'checksum', got '{text}'"))),
    }
}

fn seconds(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = value.extract().map_err(|_| type_error(name, "seconds (int or float)", value))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| PyValueError::new_err(format!("{name}: {secs} is not a usable number of seconds")))
}
