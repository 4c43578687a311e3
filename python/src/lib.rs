//! `ferry._ferry`, the extension module behind the `ferry` Python package:
//! Ferry's engine called in-process, the GIL released for all I/O.
//!
//! Every call runs on one tokio runtime per process. Calls with the same
//! options and bucket share one [`Engine`], so Python threads calling in
//! parallel share its request budget, its buffer pool and its connections
//! instead of each opening their own; a pull or a push gets an engine of
//! its own, as a `ferry-stager` run does, so its summary is its own.
//!
//! The Python face (`Summary`, docstrings, type stubs) is in `python/ferry`.

mod buffer;
mod errors;
mod options;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferry_contract::summary::Summary;
use ferry_contract::{ObjectLocation, TransferOptions};
use ferry_engine::error_chain;
use ferry_engine::metrics::Metrics;
use ferry_engine::transfer::receive::ObjectError;
use ferry_engine::transfer::tally::{Operation, Tally, one_line};
use ferry_engine::transfer::{Engine, TransferConfig, TransferError, memory, pull, push};
use futures::StreamExt as _;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::Buffer;

/// The runtime every call runs on, shared with asyncio awaitables.
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Runs `work` on the runtime with the GIL released, the calling thread
/// waiting for it. The work runs on the runtime's own threads, beside the
/// connections' I/O, rather than on the caller's, which would be woken for
/// every step of every request.
fn detached<F>(py: Python<'_>, work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    py.detach(|| {
        let task = runtime().spawn(work);
        futures::executor::block_on(task).unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    })
}

/// Why a call failed, before it becomes a Python exception.
enum Failure {
    /// The options or the store refused the whole call.
    Run(TransferError),
    /// One object could not be read or written.
    Object(String, ObjectError),
    /// A pull or push finished with failed objects.
    Incomplete(Box<Summary>),
}

impl Failure {
    fn into_py_err(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Run(TransferError::Config(message)) => PyValueError::new_err(message),
            Failure::Run(error) => errors::error(py, error.reason(), error_chain(&error)),
            Failure::Object(uri, error) => errors::error(py, error.reason(), format!("{uri}: {}", error_chain(&error))),
            Failure::Incomplete(summary) => errors::incomplete(
                py,
                one_line(&summary),
                serde_json::to_string(&summary).expect("a summary serializes"),
            ),
        }
    }

    /// For awaitables, which make their exception once the work is done.
    fn into_py_err_attached(self) -> PyErr {
        Python::attach(|py| self.into_py_err(py))
    }
}

/// Engines by what makes one differ: the store (scheme, bucket) and every
/// option. Shared by all threads and awaitables of the process.
fn engines() -> &'static Mutex<HashMap<String, Arc<Engine>>> {
    static ENGINES: OnceLock<Mutex<HashMap<String, Arc<Engine>>>> = OnceLock::new();
    ENGINES.get_or_init(Mutex::default)
}

/// The shared engine for `options` on the bucket of `location`.
async fn shared_engine(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<Engine>, Failure> {
    let id = format!("{}://{} {options:?}", location.scheme, location.bucket);
    if let Some(engine) = engines().lock().expect("engine cache poisoned").get(&id) {
        return Ok(Arc::clone(engine));
    }
    let engine = new_engine(options, location).await?;
    // Two first calls may race; both engines work, the first one stays.
    Ok(Arc::clone(engines().lock().expect("engine cache poisoned").entry(id).or_insert(engine)))
}

/// An engine of its own, for one pull or push.
async fn new_engine(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<Engine>, Failure> {
    let config = TransferConfig::from_options(options).map_err(Failure::Run)?;
    let store = ferry_store::connect(options, location)
        .await
        .map_err(|source| Failure::Run(TransferError::Store { uri: location.to_string(), source }))?;
    Engine::new(store, config, Arc::new(Metrics::new())).map_err(Failure::Run)
}

/// A `scheme://bucket/key` URI, parsed before any work starts (so a bad
/// one is a `ValueError` at the call, not a failure of the transfer).
struct ObjectUri {
    /// As the caller wrote it, for messages.
    uri: String,
    /// The bucket's location.
    location: ObjectLocation,
    /// The object's key.
    key: String,
}

impl ObjectUri {
    fn parse(uri: String) -> PyResult<Self> {
        let location = prefix_uri(&uri)?;
        // The location of a prefix ends in '/'; an object's key does not.
        let key = location.prefix.strip_suffix('/').unwrap_or(&location.prefix).to_owned();
        if key.is_empty() {
            return Err(PyValueError::new_err(format!("uri: '{uri}' names a bucket, not an object (s3://BUCKET/KEY)")));
        }
        Ok(Self { uri, location, key })
    }
}

fn object_uris(uris: Vec<String>) -> PyResult<Vec<ObjectUri>> {
    uris.into_iter().map(ObjectUri::parse).collect()
}

/// A `scheme://bucket[/prefix]` URI.
fn prefix_uri(uri: &str) -> PyResult<ObjectLocation> {
    uri.parse().map_err(|e| PyValueError::new_err(format!("uri: {e}")))
}

fn byte_range(range: Option<(u64, u64)>) -> PyResult<Option<Range<u64>>> {
    match range {
        Some((start, end)) if end < start => Err(PyValueError::new_err(format!(
            "range: ({start}, {end}) ends before it starts; (start, end) with end exclusive"
        ))),
        other => Ok(other.map(|(start, end)| start..end)),
    }
}

async fn read_object(
    object: ObjectUri,
    range: Option<Range<u64>>,
    options: TransferOptions,
) -> Result<Buffer, Failure> {
    let engine = shared_engine(&options, &object.location).await?;
    let read = match range {
        None => memory::read(&engine, &object.key).await,
        Some(range) => memory::read_range(&engine, &object.key, range).await,
    };
    read.map(Buffer::new).map_err(|e| Failure::Object(object.uri, e))
}

async fn read_objects(objects: Vec<ObjectUri>, options: TransferOptions) -> Result<Vec<Buffer>, Failure> {
    let at_once = options.concurrency.ceiling() as usize;
    futures::stream::iter(objects)
        .map(|object| {
            let options = options.clone();
            // A task per object, so objects are received on every core.
            runtime().spawn(read_object(object, None, options))
        })
        .buffered(at_once)
        .map(|joined| joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

async fn write_object(object: ObjectUri, data: bytes::Bytes, options: TransferOptions) -> Result<(), Failure> {
    let engine = shared_engine(&options, &object.location).await?;
    memory::write(&engine, &object.key, data).await.map(drop).map_err(|e| Failure::Object(object.uri, e))
}

async fn write_file_object(path: PathBuf, object: ObjectUri, options: TransferOptions) -> Result<(), Failure> {
    let engine = shared_engine(&options, &object.location).await?;
    memory::write_file(&engine, &path, &object.key).await.map(drop).map_err(|e| Failure::Object(object.uri, e))
}

/// A pull or push with its own engine; its summary as JSON.
async fn run_transfer(
    operation: Operation,
    location: ObjectLocation,
    directory: PathBuf,
    options: TransferOptions,
    progress: Option<Py<PyAny>>,
) -> Result<String, Failure> {
    if operation == Operation::Push {
        ferry_engine::options::check_push(&options).map_err(Failure::Run)?;
        ferry_engine::options::check_push_destination(&location).map_err(Failure::Run)?;
    }
    let engine = new_engine(&options, &location).await?;
    let reporter = progress.map(|callback| {
        let tally = Arc::clone(&engine.tally);
        tokio::spawn(report_progress(tally, callback))
    });
    let summary = match operation {
        Operation::Pull => pull::pull(engine, &location.prefix, &directory, options.delete_removed).await,
        Operation::Push => push::push(engine, &directory, &location.prefix).await,
    };
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    let summary = summary.map_err(Failure::Run)?;
    if !summary.complete {
        return Err(Failure::Incomplete(Box::new(summary)));
    }
    Ok(serde_json::to_string(&summary).expect("a summary serializes"))
}

/// What a progress callback is given.
#[pyclass(frozen, get_all, module = "ferry")]
struct Progress {
    /// Bytes in place so far (copied or already there).
    bytes_done: u64,
    /// Bytes selected so far (grows while the listing runs).
    bytes_total: u64,
    /// Objects finished so far.
    objects_done: u64,
    /// Objects selected so far.
    objects_total: u64,
    /// Whether the totals are final (the listing is complete).
    totals_final: bool,
}

#[pymethods]
impl Progress {
    fn __repr__(&self) -> String {
        format!(
            "Progress(bytes_done={}, bytes_total={}, objects_done={}, objects_total={}, totals_final={})",
            self.bytes_done,
            self.bytes_total,
            self.objects_done,
            self.objects_total,
            if self.totals_final { "True" } else { "False" }
        )
    }
}

/// Calls `callback(Progress)` four times a second until aborted. An
/// exception in the callback is printed, as Python prints one raised in a
/// thread, and does not stop the transfer.
async fn report_progress(tally: Arc<Tally>, callback: Py<PyAny>) {
    loop {
        let s = tally.snapshot();
        let progress = Progress {
            bytes_done: s.bytes_done,
            bytes_total: s.bytes_selected,
            objects_done: s.objects_done,
            objects_total: s.objects_selected,
            totals_final: s.listing_done,
        };
        Python::attach(|py| {
            if let Err(error) = callback.call1(py, (progress,)) {
                error.print(py);
            }
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads the object at `uri` (`s3://BUCKET/KEY`, `gs://BUCKET/KEY` or `az://CONTAINER/KEY`) into
/// memory, verified against the store's checksum, and returns it as a
/// `ferry.Buffer` (bytes-like, no copy). `range=(start, end)` reads bytes
/// `start` to `end` (exclusive), checked for length only.
#[pyfunction]
#[pyo3(signature = (uri, range=None, **options))]
fn read(
    py: Python<'_>,
    uri: String,
    range: Option<(u64, u64)>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Buffer> {
    let (range, options) = (byte_range(range)?, options::parse(options)?);
    detached(py, read_object(ObjectUri::parse(uri)?, range, options)).map_err(|f| f.into_py_err(py))
}

/// `read` as an awaitable.
#[pyfunction]
#[pyo3(signature = (uri, range=None, **options))]
fn read_async<'py>(
    py: Python<'py>,
    uri: String,
    range: Option<(u64, u64)>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (object, range, options) = (ObjectUri::parse(uri)?, byte_range(range)?, options::parse(options)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        read_object(object, range, options).await.map_err(Failure::into_py_err_attached)
    })
}

/// Reads many objects at once (up to `concurrency` in flight, one request
/// budget) and returns their buffers in the order of `uris`.
#[pyfunction]
#[pyo3(signature = (uris, **options))]
fn read_many(py: Python<'_>, uris: Vec<String>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<Buffer>> {
    let options = options::parse(options)?;
    detached(py, read_objects(object_uris(uris)?, options)).map_err(|f| f.into_py_err(py))
}

/// `read_many` as an awaitable.
#[pyfunction]
#[pyo3(signature = (uris, **options))]
fn read_many_async<'py>(
    py: Python<'py>,
    uris: Vec<String>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (objects, options) = (object_uris(uris)?, options::parse(options)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        read_objects(objects, options).await.map_err(Failure::into_py_err_attached)
    })
}

/// Writes `data` (any bytes-like object, sent without a copy) as the object
/// at `uri`: one PUT, or a multipart upload above `multipart_threshold`,
/// every part with its CRC32C.
#[pyfunction]
#[pyo3(signature = (uri, data, **options))]
fn write(py: Python<'_>, uri: String, data: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let options = options::parse(options)?;
    let data = buffer::borrow(py, data)?;
    detached(py, write_object(ObjectUri::parse(uri)?, data, options)).map_err(|f| f.into_py_err(py))
}

/// `write` as an awaitable.
#[pyfunction]
#[pyo3(signature = (uri, data, **options))]
fn write_async<'py>(
    py: Python<'py>,
    uri: String,
    data: &Bound<'py, PyAny>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = options::parse(options)?;
    let (object, data) = (ObjectUri::parse(uri)?, buffer::borrow(py, data)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        write_object(object, data, options).await.map_err(Failure::into_py_err_attached)
    })
}

/// Writes the file at `path` as the object at `uri`, reading parts as they
/// are sent (memory stays within `memory_limit`).
#[pyfunction]
#[pyo3(signature = (path, uri, **options))]
fn write_file(py: Python<'_>, path: PathBuf, uri: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let options = options::parse(options)?;
    detached(py, write_file_object(path, ObjectUri::parse(uri)?, options)).map_err(|f| f.into_py_err(py))
}

/// `write_file` as an awaitable.
#[pyfunction]
#[pyo3(signature = (path, uri, **options))]
fn write_file_async<'py>(
    py: Python<'py>,
    path: PathBuf,
    uri: String,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (object, options) = (ObjectUri::parse(uri)?, options::parse(options)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        write_file_object(path, object, options).await.map_err(Failure::into_py_err_attached)
    })
}

/// Copies every object under `uri` into `directory` as `ferry-stager pull`
/// does; returns the run's summary as JSON.
#[pyfunction]
#[pyo3(signature = (uri, directory, progress=None, **options))]
fn pull_json(
    py: Python<'_>,
    uri: String,
    directory: PathBuf,
    progress: Option<Py<PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let options = options::parse(options)?;
    detached(py, run_transfer(Operation::Pull, prefix_uri(&uri)?, directory, options, progress))
        .map_err(|f| f.into_py_err(py))
}

/// `pull_json` as an awaitable.
#[pyfunction]
#[pyo3(signature = (uri, directory, progress=None, **options))]
fn pull_json_async<'py>(
    py: Python<'py>,
    uri: String,
    directory: PathBuf,
    progress: Option<Py<PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (location, options) = (prefix_uri(&uri)?, options::parse(options)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        run_transfer(Operation::Pull, location, directory, options, progress)
            .await
            .map_err(Failure::into_py_err_attached)
    })
}

/// Copies every file under `directory` to `uri` as `ferry-stager push`
/// does; returns the run's summary as JSON.
#[pyfunction]
#[pyo3(signature = (directory, uri, progress=None, **options))]
fn push_json(
    py: Python<'_>,
    directory: PathBuf,
    uri: String,
    progress: Option<Py<PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let options = options::parse(options)?;
    detached(py, run_transfer(Operation::Push, prefix_uri(&uri)?, directory, options, progress))
        .map_err(|f| f.into_py_err(py))
}

/// `push_json` as an awaitable.
#[pyfunction]
#[pyo3(signature = (directory, uri, progress=None, **options))]
fn push_json_async<'py>(
    py: Python<'py>,
    directory: PathBuf,
    uri: String,
    progress: Option<Py<PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (location, options) = (prefix_uri(&uri)?, options::parse(options)?);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        run_transfer(Operation::Push, location, directory, options, progress)
            .await
            .map_err(Failure::into_py_err_attached)
    })
}

/// Ferry's copy engine, in-process.
/// Blocking threads the Python package adds to the engine's for handing
/// finished awaitables' results back to Python.
const AWAITABLES_HANDED_BACK_AT_ONCE: usize = 64;

#[pymodule]
fn _ferry(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // Before the first call starts the runtime: the engine's blocking pool
    // bound (see `ferry_engine::runtime`), plus room for the awaitables'
    // results, which pyo3-async-runtimes hands to Python from blocking
    // threads that wait for the GIL, so that a Python thread holding the
    // GIL for long does not stop the engine's file work too.
    let mut runtime = ferry_engine::runtime::builder();
    runtime.max_blocking_threads(
        ferry_engine::runtime::blocking_threads(ferry_engine::transfer::cores()) + AWAITABLES_HANDED_BACK_AT_ONCE,
    );
    pyo3_async_runtimes::tokio::init(runtime);
    module.add_class::<Buffer>()?;
    module.add_class::<Progress>()?;
    errors::register(module)?;
    module.add("OPTIONS", options::NAMES.to_vec())?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    for function in [
        wrap_pyfunction!(read, module)?,
        wrap_pyfunction!(read_async, module)?,
        wrap_pyfunction!(read_many, module)?,
        wrap_pyfunction!(read_many_async, module)?,
        wrap_pyfunction!(write, module)?,
        wrap_pyfunction!(write_async, module)?,
        wrap_pyfunction!(write_file, module)?,
        wrap_pyfunction!(write_file_async, module)?,
        wrap_pyfunction!(pull_json, module)?,
        wrap_pyfunction!(pull_json_async, module)?,
        wrap_pyfunction!(push_json, module)?,
        wrap_pyfunction!(push_json_async, module)?,
    ] {
        module.add_function(function)?;
    }
    Ok(())
}
