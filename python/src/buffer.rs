//! Bytes shared with Python without copying, both ways.
//!
//! A read object is handed to Python as a [`Buffer`]: it owns the
//! engine's contiguous `Bytes` and exposes them through the buffer protocol
//! (`memoryview(b)`, `numpy.frombuffer(b)`, `bytes(b)` for a copy). A write
//! borrows the caller's buffer (`bytes`, `bytearray`, `memoryview`, numpy)
//! through [`borrow`] for as long as its parts are in flight.
//!
//! This is the only module with `unsafe` code: the buffer protocol is a C
//! interface.
#![allow(unsafe_code)]

use std::ffi::{CString, c_int, c_void};

use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::{ffi, types::PyBytes};

/// An object's bytes, read-only, shared with Python without a copy.
#[pyclass(frozen, module = "ferry")]
pub struct Buffer {
    bytes: Bytes,
}

impl Buffer {
    /// Wraps bytes the engine read.
    pub fn new(bytes: Bytes) -> Self {
        Self { bytes }
    }
}

#[pymethods]
impl Buffer {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// A copy as `bytes`.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    fn __repr__(&self) -> String {
        format!("<ferry.Buffer of {} bytes>", self.bytes.len())
    }

    /// Equal to any bytes-like object with the same content.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        let Ok(view) = PyBuffer::<u8>::get(other) else { return false };
        view.is_c_contiguous() && Borrowed(view).as_ref() == &self.bytes[..]
    }

    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("View is null"));
        }
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a ferry.Buffer is read-only; bytearray(b) makes a writable copy"));
        }
        let (ptr, len) = {
            let this = slf.get();
            (this.bytes.as_ptr(), this.bytes.len())
        };
        // SAFETY: `view` is valid (CPython's contract); the bytes live as
        // long as the Buffer, which the view keeps alive through `obj`, and
        // `Bytes` never moves or frees its data while referenced.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if (flags & ffi::PyBUF_FORMAT) == ffi::PyBUF_FORMAT {
                CString::new("B").expect("static format").into_raw()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape =
                if (flags & ffi::PyBUF_ND) == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
            (*view).strides = if (flags & ffi::PyBUF_STRIDES) == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// # Safety
    /// Called by CPython with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `format` is null or the CString made in `__getbuffer__`.
        unsafe {
            if !(*view).format.is_null() {
                drop(CString::from_raw((*view).format));
            }
        }
    }
}

/// The caller's buffer, held (and so kept alive and pinned) while the
/// engine sends it.
struct Borrowed(PyBuffer<u8>);

impl AsRef<[u8]> for Borrowed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: only C-contiguous buffers are wrapped (`borrow`, `__eq__`); the exporter
        // keeps `len_bytes` bytes at `buf_ptr` valid until the PyBuffer is
        // released, which happens when this is dropped.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.0.len_bytes()) }
    }
}

/// The bytes of any object with the buffer protocol, without a copy when
/// they are contiguous (bytes, bytearray, memoryview, numpy arrays). A
/// caller that changes a mutable buffer while it is being written gets
/// whatever bytes were there when each part was sent, as with any writer.
///
/// # Errors
/// `TypeError` when `data` does not support the buffer protocol.
pub fn borrow(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let view = PyBuffer::<u8>::get(data).map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "data: expected a bytes-like object (bytes, bytearray, memoryview), got {}",
            data.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })?;
    if view.is_c_contiguous() {
        return Ok(Bytes::from_owner(Borrowed(view)));
    }
    Ok(Bytes::from(view.to_vec(py)?))
}
