//! Python bindings of retryledger-core: the extension module `retryledger._core`.
//!
//! The module functions are thin glue over [`retryledger_core::api`]: JSON
//! text in, JSON text out. A failure raises the exception class of the error
//! code's family (`retryledger._errors.from_error_json` applied to the core's
//! `error_json`: code, family, message, path, attempt index), or `CoreError`
//! carrying that JSON when the pure-Python package is not importable.
//!
//! [`PySession`] is the core's [`Session`] for a host: [`PySession::next`]
//! gives the decision as a frozen `Dispatch` or `Terminal` object,
//! [`PySession::observe`] takes the host's plain [`Facts`] (validated by the
//! core's own decoder, built once and reused across attempts) and returns
//! the core's [`Judgement`]; [`PySession::seal`] gives the sealed run whose
//! receipt is a dict built here, and whose digest and bundle are computed
//! only when asked for. No JSON crosses per attempt.

mod drive;
mod hedge;
mod journal;
mod machine;

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, digest_of, Encode, FieldTable, Sink};
use retryledger_core::decode::{from_str, from_value, parse_strict, At};
use retryledger_core::error::{Error, ErrorCode};
use retryledger_core::limits::{MAX_DEPTH, MAX_SAFE_INTEGER};
use retryledger_core::observe::{Facts, Judgement};
use retryledger_core::receipt::BundleSchema;
use retryledger_core::{Attempts, CompiledPolicy, Decision, Dispatch, Outcome, Receipt, Session};
use serde_json::{Map, Number, Value};

create_exception!(
    retryledger._core,
    CoreError,
    PyValueError,
    "A core error; its single argument is the error as JSON (code, family, message, path, attempt_index)."
);

/// `retryledger._errors.from_error_json`, looked up on the first error.
static ERROR_FACTORY: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

fn raise(e: &Error) -> PyErr {
    let text = api::error_json(e);
    Python::attach(|py| {
        let factory = ERROR_FACTORY.get_or_init(py, || {
            py.import("retryledger._errors")
                .and_then(|m| m.getattr("from_error_json"))
                .map(Bound::unbind)
                .ok()
        });
        match factory.as_ref().map(|f| f.call1(py, (text.as_str(),))) {
            Some(Ok(exc)) => PyErr::from_value(exc.into_bound(py)),
            _ => CoreError::new_err(text),
        }
    })
}

fn lift<T>(r: retryledger_core::Result<T>) -> PyResult<T> {
    r.map_err(|e| raise(&e))
}

fn coded(code: ErrorCode, path: &str, message: &str) -> PyErr {
    raise(&Error::at(code, path, message))
}

/// JSON text from a Python `str`; anything else is a coded error, never a crash.
fn text<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, str>> {
    let s = obj
        .cast::<PyString>()
        .map_err(|_| raise(&Error::new(ErrorCode::InvalidType, "expected JSON text")))?;
    s.to_cow().map_err(|_| {
        raise(&Error::new(
            ErrorCode::InvalidJson,
            "text is not valid Unicode (unpaired surrogate)",
        ))
    })
}

/// An integer argument in 0..=2^53-1, with the decoder's codes otherwise.
fn integer(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if let Ok(v) = obj.extract::<u64>() {
        if v <= MAX_SAFE_INTEGER && !obj.is_instance_of::<PyBool>() {
            return Ok(v);
        }
    }
    let path = format!("/{name}");
    Err(
        if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
            if obj.is_instance_of::<PyFloat>() {
                coded(ErrorCode::FloatValue, &path, "expected an integer")
            } else {
                coded(ErrorCode::InvalidType, &path, "expected an integer")
            }
        } else {
            coded(
                ErrorCode::IntegerOutOfRange,
                &path,
                "integer outside 0..=2^53 - 1",
            )
        },
    )
}

// ---- Python values from documents, and strict values from Python ----------

/// A small, fast hasher for the string cache (short ASCII keys).
#[derive(Default)]
struct ShortHasher(u64);

impl ShortHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl std::hash::Hasher for ShortHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            // Byte by byte: a copy into a word on the stack, read back at
            // once as a word, stalls on store forwarding.
            let word = rest
                .iter()
                .rev()
                .fold(0u64, |w, b| (w << 8) | u64::from(*b));
            self.mix(word);
        }
    }
    fn write_u8(&mut self, b: u8) {
        self.mix(u64::from(b));
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The string cache: by text, and in front of it a small table by the
/// text's address and length, so that a string met again at the same place
/// (a field name, an outcome name, a route id) is found without hashing
/// its text (a hit still compares the text, so an address reused by other
/// text is a miss).
#[derive(Default)]
struct StrCache {
    map: std::collections::HashMap<
        Box<str>,
        Py<PyString>,
        std::hash::BuildHasherDefault<ShortHasher>,
    >,
    front: Vec<Option<FrontSlot>>,
    /// The strings of field names met before ([`Sink::field`]).
    fields: FieldTable<Py<PyString>>,
}

/// A string of the table by address: the address it was met at, its text, the string.
type FrontSlot = (usize, Box<str>, Py<PyString>);

/// Slots of the table by address (a power of two).
const FRONT_SLOTS: usize = 1024;

/// Whether two texts are equal, eight bytes at a time and inline (short
/// texts: no call into the library's byte comparison).
#[inline]
fn same_text(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    while let (Some((p, x)), Some((q, y))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if u64::from_ne_bytes(*p) != u64::from_ne_bytes(*q) {
            return false;
        }
        (a, b) = (x, y);
    }
    a.iter().zip(b).all(|(p, q)| p == q)
}

impl StrCache {
    fn len(&self) -> usize {
        self.map.len()
    }

    #[inline]
    fn slot(s: &str) -> usize {
        let at = s.as_ptr() as usize;
        ((at >> 3) ^ (at >> 11) ^ s.len()) & (FRONT_SLOTS - 1)
    }

    /// The string at this address with this text, if met there before.
    #[inline]
    fn front<'py>(&self, py: Python<'py>, s: &str) -> Option<Bound<'py, PyString>> {
        match self.front.get(Self::slot(s)) {
            Some(Some((at, text, v))) if *at == s.as_ptr() as usize && same_text(text, s) => {
                Some(v.bind(py).clone())
            }
            _ => None,
        }
    }

    /// A field name's string, if met before.
    #[inline]
    fn field<'py>(&self, py: Python<'py>, name: &'static str) -> Option<Bound<'py, PyString>> {
        self.fields.get(name).map(|v| v.bind(py).clone())
    }

    fn remember_field(&mut self, name: &'static str, v: &Bound<'_, PyString>) {
        self.fields.insert(name, v.clone().unbind());
    }

    fn remember(&mut self, s: &str, v: &Bound<'_, PyString>) {
        if self.front.is_empty() {
            self.front.resize_with(FRONT_SLOTS, || None);
        }
        if let Some(slot) = self.front.get_mut(Self::slot(s)) {
            *slot = Some((s.as_ptr() as usize, s.into(), v.clone().unbind()));
        }
    }
}

/// Strings documents repeat (field names, route ids, outcome names, schema
/// names) are made once per thread and shared: immutable, interned, hashed.
const CACHED_STR_BYTES: usize = 48;
const CACHED_STRS: usize = 1024;

thread_local! {
    static STRS: std::cell::RefCell<StrCache> = std::cell::RefCell::new(StrCache::default());
}

/// A string made once per thread when it is short (`true`: from the cache,
/// so equal strings are the same object).
fn short_str<'py>(py: Python<'py>, cache: &mut StrCache, s: &str) -> (Bound<'py, PyString>, bool) {
    if s.len() > CACHED_STR_BYTES {
        return (PyString::new(py, s), false);
    }
    if let Some(v) = cache.front(py, s) {
        return (v, true);
    }
    if let Some(v) = cache.map.get(s) {
        let v = v.bind(py).clone();
        cache.remember(s, &v);
        return (v, true);
    }
    let v = PyString::intern(py, s);
    let cached = cache.len() < CACHED_STRS;
    if cached {
        cache.map.insert(s.into(), v.clone().unbind());
        cache.remember(s, &v);
    }
    (v, cached)
}

/// Templates by a hash of their key strings' addresses: the addresses in
/// order (checked on every hit) and the dict.
type Shapes = std::collections::HashMap<
    u64,
    (Vec<usize>, Py<PyDict>),
    std::hash::BuildHasherDefault<ShortHasher>,
>;

const SHAPES: usize = 256;

thread_local! {
    /// One dict per object shape (its cached key strings, in order), values
    /// `None`: copying it and setting the values builds an object without
    /// growing a dict key by key.
    static TEMPLATES: std::cell::RefCell<Shapes> = std::cell::RefCell::new(Shapes::default());
}

/// A dict with these keys in this order and these values.
fn dict_of<'py>(
    py: Python<'py>,
    shapes: &mut Shapes,
    pairs: &[(Bound<'py, PyString>, Bound<'py, PyAny>)],
    shared_keys: bool,
) -> PyResult<Bound<'py, PyDict>> {
    if shared_keys && pairs.len() > 4 {
        let mut hasher = ShortHasher::default();
        for (k, _) in pairs {
            hasher.mix(k.as_ptr() as u64);
        }
        let shape = std::hash::Hasher::finish(&hasher);
        let same = |keys: &[usize]| {
            keys.len() == pairs.len()
                && keys
                    .iter()
                    .zip(pairs)
                    .all(|(a, (k, _))| *a == k.as_ptr() as usize)
        };
        let template = (|| -> PyResult<Option<Py<PyDict>>> {
            if let Some((keys, t)) = shapes.get(&shape) {
                return Ok(same(keys).then(|| t.clone_ref(py)));
            }
            if shapes.len() >= SHAPES {
                return Ok(None);
            }
            let t = PyDict::new(py);
            for (k, _) in pairs {
                t.set_item(k, py.None())?;
            }
            let keys = pairs.iter().map(|(k, _)| k.as_ptr() as usize).collect();
            shapes.insert(shape, (keys, t.clone().unbind()));
            Ok(Some(t.unbind()))
        })()?;
        if let Some(t) = template {
            let d = t.bind(py).copy()?;
            for (k, v) in pairs {
                d.set_item(k, v)?;
            }
            return Ok(d);
        }
    }
    let d = PyDict::new(py);
    for (k, v) in pairs {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// An object or array being built: where its pairs or items start in the
/// sink's shared buffers, and the key it goes under in its parent.
enum Frame<'py> {
    Object {
        start: usize,
        shared_keys: bool,
        key: Option<Bound<'py, PyString>>,
    },
    Array {
        start: usize,
        key: Option<Bound<'py, PyString>>,
    },
}

/// Builds Python objects (dicts in canonical key order, lists, ints, bools,
/// strs) from a document's encoding events.
struct PySink<'py, 'c> {
    py: Python<'py>,
    strs: &'c mut StrCache,
    shapes: &'c mut Shapes,
    stack: Vec<Frame<'py>>,
    /// The pairs of every object being built, innermost last (one buffer,
    /// not one per object).
    pairs: Vec<(Bound<'py, PyString>, Bound<'py, PyAny>)>,
    /// The items of every array being built, innermost last.
    items: Vec<Bound<'py, PyAny>>,
    key: Option<(Bound<'py, PyString>, bool)>,
    done: Option<Bound<'py, PyAny>>,
    failed: Option<PyErr>,
}

impl<'py> PySink<'py, '_> {
    fn put(&mut self, value: Bound<'py, PyAny>) {
        let key = self.key.take();
        match (self.stack.last_mut(), key) {
            (None, _) => self.done = Some(value),
            (Some(Frame::Object { shared_keys, .. }), Some((k, cached))) => {
                *shared_keys &= cached;
                self.pairs.push((k, value));
            }
            (Some(Frame::Array { .. }), _) => self.items.push(value),
            (Some(Frame::Object { .. }), None) => {}
        }
    }

    fn close(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        let (value, key) = match frame {
            Frame::Object {
                start,
                shared_keys,
                key,
            } => {
                let pairs = self.pairs.get(start..).unwrap_or_default();
                let value = dict_of(self.py, self.shapes, pairs, shared_keys).map(Bound::into_any);
                self.pairs.truncate(start);
                (value, key)
            }
            Frame::Array { start, key } => {
                let items = self.items.get(start..).unwrap_or_default();
                let value = PyList::new(self.py, items).map(Bound::into_any);
                self.items.truncate(start);
                (value, key)
            }
        };
        self.key = key.map(|k| (k, true));
        match value {
            Ok(v) => self.put(v),
            Err(e) => {
                self.failed.get_or_insert(e);
            }
        }
    }

    fn parent_key(&mut self) -> Option<Bound<'py, PyString>> {
        self.key.take().map(|(k, _)| k)
    }
}

impl Sink for PySink<'_, '_> {
    fn begin_object(&mut self) {
        let key = self.parent_key();
        self.stack.push(Frame::Object {
            start: self.pairs.len(),
            shared_keys: true,
            key,
        });
    }
    fn key(&mut self, key: &str) {
        self.key = Some(short_str(self.py, self.strs, key));
    }
    fn field(&mut self, name: &'static str) {
        if let Some(v) = self.strs.field(self.py, name) {
            self.key = Some((v, true));
            return;
        }
        let (v, cached) = short_str(self.py, self.strs, name);
        if cached {
            self.strs.remember_field(name, &v);
        }
        self.key = Some((v, cached));
    }
    fn end_object(&mut self) {
        self.close();
    }
    fn begin_array(&mut self) {
        let key = self.parent_key();
        self.stack.push(Frame::Array {
            start: self.items.len(),
            key,
        });
    }
    fn end_array(&mut self) {
        self.close();
    }
    fn u64(&mut self, v: u64) {
        let Ok(value) = v.into_pyobject(self.py);
        self.put(value.into_any());
    }
    fn bool(&mut self, v: bool) {
        self.put(PyBool::new(self.py, v).to_owned().into_any());
    }
    fn str(&mut self, v: &str) {
        let (value, _) = short_str(self.py, self.strs, v);
        self.put(value.into_any());
    }
}

/// A document as plain Python values (its objects as dicts in canonical order).
fn to_py<'py, T: Encode + ?Sized>(py: Python<'py>, doc: &T) -> PyResult<Bound<'py, PyAny>> {
    STRS.with(|strs| {
        TEMPLATES.with(|shapes| {
            let (Ok(mut strs), Ok(mut shapes)) = (strs.try_borrow_mut(), shapes.try_borrow_mut())
            else {
                // Re-entered (a destructor ran Python code): no caches.
                return build(py, doc, &mut StrCache::default(), &mut Shapes::default());
            };
            build(py, doc, &mut strs, &mut shapes)
        })
    })
}

fn build<'py, T: Encode + ?Sized>(
    py: Python<'py>,
    doc: &T,
    strs: &mut StrCache,
    shapes: &mut Shapes,
) -> PyResult<Bound<'py, PyAny>> {
    let mut sink = PySink {
        py,
        strs,
        shapes,
        stack: Vec::new(),
        pairs: Vec::with_capacity(32),
        items: Vec::new(),
        key: None,
        done: None,
        failed: None,
    };
    doc.encode(&mut sink);
    if let Some(e) = sink.failed {
        return Err(e);
    }
    Ok(sink.done.unwrap_or_else(|| py.None().into_bound(py)))
}

/// A Python value as a strict JSON value: what the core's parser admits from
/// text (integers in 0..=2^53-1, no floats, no nulls, string keys, at most
/// `MAX_DEPTH` levels), with its codes and JSON Pointers otherwise.
fn value_of(obj: &Bound<'_, PyAny>, at: &At<'_>, depth: usize) -> retryledger_core::Result<Value> {
    if obj.is_none() {
        return Err(at.error(ErrorCode::NullValue, "null is not a value here"));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return match obj.extract::<u64>() {
            Ok(v) if v <= MAX_SAFE_INTEGER => Ok(Value::Number(Number::from(v))),
            _ => Err(at.error(ErrorCode::IntegerOutOfRange, "integer outside 0..=2^53 - 1")),
        };
    }
    if obj.is_instance_of::<PyFloat>() {
        return Err(at.error(ErrorCode::FloatValue, "expected an integer, not a float"));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return s
            .to_cow()
            .map(|s| Value::String(s.into_owned()))
            .map_err(|_| {
                at.error(
                    ErrorCode::InvalidJson,
                    "string is not valid Unicode (unpaired surrogate)",
                )
            });
    }
    if depth >= MAX_DEPTH {
        return Err(at.error(ErrorCode::NestingTooDeep, "nesting deeper than the limit"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let Ok(k) = k.cast::<PyString>() else {
                return Err(at.error(ErrorCode::InvalidType, "object keys are strings"));
            };
            let key = k
                .to_cow()
                .map_err(|_| at.error(ErrorCode::InvalidJson, "key is not valid Unicode"))?;
            let value = value_of(&v, &At::Key(at, &key), depth.saturating_add(1))?;
            if map.insert(key.into_owned(), value).is_some() {
                return Err(at.error(ErrorCode::DuplicateKey, "a key repeats"));
            }
        }
        return Ok(Value::Object(map));
    }
    let items: Option<Vec<Bound<'_, PyAny>>> = if let Ok(l) = obj.cast::<PyList>() {
        Some(l.iter().collect())
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        Some(t.iter().collect())
    } else {
        None
    };
    match items {
        Some(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| value_of(x, &At::Index(at, i), depth.saturating_add(1)))
            .collect::<retryledger_core::Result<Vec<_>>>()
            .map(Value::Array),
        None => Err(at.error(
            ErrorCode::InvalidType,
            "expected a JSON value (dict, list, tuple, str, int or bool)",
        )),
    }
}

// ---- module functions -------------------------------------------------------

/// `validate_policy`: the policy digest.
#[pyfunction]
fn validate_policy(policy: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::validate_policy(&text(policy)?))
}

/// `plan_next`: the decision as JSON.
#[pyfunction]
fn plan_next(policy: &Bound<'_, PyAny>, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::plan_next(&text(policy)?, &text(attempts)?))
}

/// `evaluate`: the receipt as JSON.
#[pyfunction]
fn evaluate(policy: &Bound<'_, PyAny>, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::evaluate(&text(policy)?, &text(attempts)?))
}

/// `verify_bundle`: the verdict as JSON.
#[pyfunction]
fn verify_bundle(bundle: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::verify(&text(bundle)?))
}

/// `digest`: the document's SHA-256 as lowercase hex.
#[pyfunction]
fn digest(document: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::digest(&text(document)?))
}

/// `parse_retry_after`: bounded milliseconds.
#[pyfunction]
fn parse_retry_after(
    header: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    now_unix_ms: u64,
    cap_ms: u64,
) -> PyResult<u64> {
    lift(api::parse_retry_after(
        &text(header)?,
        &text(value)?,
        now_unix_ms,
        cap_ms,
    ))
}

/// `classify_http`: the outcome as JSON.
#[pyfunction]
fn classify_http(observation: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::classify_http(&text(observation)?))
}

/// `judge`: facts as JSON text in, the judgement (`outcome`, `rule`) as JSON out.
#[pyfunction]
fn judge(facts: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::judge(&text(facts)?))
}

/// `next_repair`: the policy (JSON) of the next repair of a chain.
#[pyfunction]
fn next_repair(
    links: &Bound<'_, PyAny>,
    request_sha256: &Bound<'_, PyAny>,
    idempotency_key_sha256: &Bound<'_, PyAny>,
    started_at_ms: u64,
) -> PyResult<String> {
    lift(api::next_repair(
        &text(links)?,
        &text(request_sha256)?,
        &text(idempotency_key_sha256)?,
        started_at_ms,
    ))
}

/// `repair_step`: the repair that may follow a chain's last run (its key,
/// the key's digest and its ordinal, as JSON), or `null` when the last
/// run's end stands.
#[pyfunction]
#[pyo3(signature = (links, root_key, tenant=None, operation=None))]
fn repair_step(
    links: &Bound<'_, PyAny>,
    root_key: &str,
    tenant: Option<&str>,
    operation: Option<&str>,
) -> PyResult<String> {
    lift(api::repair_step(&text(links)?, root_key, tenant, operation))
}

/// `check_model`: the model names an attempt reports (`/model/requested`,
/// `/model/served`), each an identifier or absent (`invalid_identifier`).
#[pyfunction]
#[pyo3(signature = (requested=None, served=None))]
fn check_model(requested: Option<&str>, served: Option<&str>) -> PyResult<()> {
    for (name, path) in [(requested, "/model/requested"), (served, "/model/served")] {
        if let Some(s) = name {
            retryledger_core::ids::Identifier::parse(s)
                .map_err(|(code, m)| coded(code, path, &m))?;
        }
    }
    Ok(())
}

/// `verify_repair_chain`: a repair chain's verdict as JSON.
#[pyfunction]
fn verify_repair_chain(chain: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::verify_repair_chain(&text(chain)?))
}

/// `breaker_admit`: `{"admission", "snapshot"}` (JSON) for a breaker configuration and snapshot at a wall-clock time.
#[pyfunction]
fn breaker_admit(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::breaker_admit(&text(config)?, &text(snapshot)?, now))
}

/// `breaker_record`: the next breaker snapshot (JSON) after an admitted attempt's outcome.
#[pyfunction]
fn breaker_record(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    probe: bool,
    outcome: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::breaker_record(
        &text(config)?,
        &text(snapshot)?,
        probe,
        &text(outcome)?,
        now,
    ))
}

/// `key_pool_select`: `{"selection", "snapshot"}` (JSON): the key of a pool
/// the next attempt uses and the snapshot to write back.
#[pyfunction]
#[pyo3(signature = (config, snapshot, now_epoch_ms, affinity=None))]
fn key_pool_select(
    config: &Bound<'_, PyAny>,
    snapshot: Option<&Bound<'_, PyAny>>,
    now_epoch_ms: &Bound<'_, PyAny>,
    affinity: Option<String>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    let snapshot = snapshot.filter(|s| !s.is_none()).map(text).transpose()?;
    lift(api::key_pool_select(
        &text(config)?,
        snapshot.as_deref(),
        now,
        affinity.as_deref(),
    ))
}

/// `key_pool_record`: the pool's next snapshot (JSON) after a key's answer.
#[pyfunction]
#[pyo3(signature = (config, snapshot, key_sha256, outcome, now_epoch_ms, status=None))]
fn key_pool_record(
    config: &Bound<'_, PyAny>,
    snapshot: Option<&Bound<'_, PyAny>>,
    key_sha256: &str,
    outcome: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
    status: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    let snapshot = snapshot.filter(|s| !s.is_none()).map(text).transpose()?;
    let status = status
        .filter(|s| !s.is_none())
        .map(|s| integer(s, "status"))
        .transpose()?;
    lift(api::key_pool_record(
        &text(config)?,
        snapshot.as_deref(),
        key_sha256,
        &text(outcome)?,
        status,
        now,
    ))
}

/// `key_sha256`: a pool key's identity (hex SHA-256 of its secret).
#[pyfunction]
fn key_sha256(secret: &str) -> PyResult<String> {
    lift(api::key_sha256(secret))
}

/// `check_idempotency_header`: `None` for an `Idempotency-Key` header value
/// the receiver's guard takes; raises `idempotency_key_invalid` otherwise.
#[pyfunction]
fn check_idempotency_header(raw: &str) -> PyResult<()> {
    lift(api::check_idempotency_header(raw))
}

/// `http_request_sha256`: the digest of an HTTP request as received.
#[pyfunction]
fn http_request_sha256(method: &str, target: &str, body: &[u8]) -> String {
    api::http_request_sha256(method, target, body)
}

/// `http_response_sha256`: the digest of a response as sent (the kept
/// headers as JSON text of `[name, value]` pairs).
#[pyfunction]
fn http_response_sha256(status: u64, headers: &str, body: &[u8]) -> PyResult<String> {
    lift(api::http_response_sha256(status, headers, body))
}

/// `budget_deposit`: the next budget snapshot (JSON) after a first attempt's deposit.
#[pyfunction]
fn budget_deposit(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::budget_deposit(&text(config)?, &text(snapshot)?, now))
}

/// `budget_withdraw`: `{"granted", "snapshot"}` (JSON) for a retry's withdrawal.
#[pyfunction]
fn budget_withdraw(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::budget_withdraw(&text(config)?, &text(snapshot)?, now))
}

/// `admission_admit`: `{"answer", "snapshot"}` (JSON) for one admission
/// under admission limits (`tenant`: the call's, under tenant shares).
#[pyfunction]
#[pyo3(signature = (config, snapshot, now_epoch_ms, queued_since_epoch_ms, tokens, tenant=None))]
fn admission_admit(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
    queued_since_epoch_ms: &Bound<'_, PyAny>,
    tokens: &Bound<'_, PyAny>,
    tenant: Option<&str>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    let since = integer(queued_since_epoch_ms, "queued_since_epoch_ms")?;
    let tokens = integer(tokens, "tokens")?;
    lift(api::admission_admit(
        &text(config)?,
        &text(snapshot)?,
        now,
        since,
        tokens,
        tenant,
    ))
}

/// `admission_release`: the next admission snapshot (JSON) once an admitted
/// attempt is over (`used`: the tokens it reported, or None).
#[pyfunction]
#[pyo3(signature = (config, snapshot, now_epoch_ms, reserved, used=None))]
fn admission_release(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
    reserved: &Bound<'_, PyAny>,
    used: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    let reserved = integer(reserved, "reserved")?;
    let used = used
        .filter(|u| !u.is_none())
        .map(|u| integer(u, "used"))
        .transpose()?;
    lift(api::admission_release(
        &text(config)?,
        &text(snapshot)?,
        now,
        reserved,
        used,
    ))
}

/// `admission_observe`: a response's rate-limit headers (JSON text of
/// `[name, value]` pairs) applied to an admission
/// snapshot; `{"notes"?, "snapshot"}` (JSON).
#[pyfunction]
fn admission_observe(
    config: &Bound<'_, PyAny>,
    snapshot: &Bound<'_, PyAny>,
    headers: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::admission_observe(
        &text(config)?,
        &text(snapshot)?,
        &text(headers)?,
        now,
    ))
}

/// Optional JSON text: `None` stays `None`.
fn opt_text<'a>(obj: Option<&'a Bound<'_, PyAny>>) -> PyResult<Option<Cow<'a, str>>> {
    obj.filter(|o| !o.is_none()).map(text).transpose()
}

/// The policy a journal call names: a `Compiled` (used as it is) or its
/// JSON text (decoded and validated for the call).
enum PolicyArg<'a> {
    Compiled(Arc<CompiledPolicy>),
    Text(Cow<'a, str>),
}

impl PolicyArg<'_> {
    fn of<'a>(policy: &'a Bound<'_, PyAny>) -> PyResult<PolicyArg<'a>> {
        match policy.cast::<Compiled>() {
            Ok(c) => Ok(PolicyArg::Compiled(Arc::clone(&c.get().inner))),
            Err(_) => Ok(PolicyArg::Text(text(policy)?)),
        }
    }

    /// `f` on the compiled policy (compiled here from text; its errors under `/policy`).
    fn with<R>(
        &self,
        f: impl FnOnce(&CompiledPolicy) -> retryledger_core::Result<R>,
    ) -> PyResult<R> {
        lift(match self {
            PolicyArg::Compiled(cp) => f(cp),
            PolicyArg::Text(t) => api::compile_policy(t)
                .map_err(|e| e.under("/policy"))
                .and_then(|cp| f(&cp)),
        })
    }
}

/// `machine_transcript`: the run machine started under `options` (or, with
/// `journal`, resumed from it) and fed `events`, as JSON (docs/COMPOSITION.md).
#[pyfunction]
#[pyo3(signature = (policy, options, journal, events))]
fn machine_transcript(
    policy: &Bound<'_, PyAny>,
    options: &Bound<'_, PyAny>,
    journal: Option<&Bound<'_, PyAny>>,
    events: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let journal = journal.map(text).transpose()?;
    lift(api::machine_transcript(
        &text(policy)?,
        &text(options)?,
        journal.as_deref(),
        &text(events)?,
    ))
}

/// `journal_verify`: what the replay of a journal (JSON array of events) found, as JSON.
#[pyfunction]
fn journal_verify(policy: &Bound<'_, PyAny>, events: &Bound<'_, PyAny>) -> PyResult<String> {
    let events = text(events)?;
    PolicyArg::of(policy)?.with(|cp| api::journal_verify_compiled(cp, &events))
}

/// `journal_recover`: `resume`, `reconcile`, `adopt` or `done` (JSON) for a
/// journal and, while an attempt waits for one, the reconciliation so far.
#[pyfunction]
#[pyo3(signature = (policy, events, reconciliation=None))]
fn journal_recover(
    policy: &Bound<'_, PyAny>,
    events: &Bound<'_, PyAny>,
    reconciliation: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let rec = opt_text(reconciliation)?;
    let events = text(events)?;
    PolicyArg::of(policy)?.with(|cp| api::journal_recover_compiled(cp, &events, rec.as_deref()))
}

/// `journal_append`: the next event (JSON) of a journal, built from an entry under a lease generation.
#[pyfunction]
fn journal_append(
    policy: &Bound<'_, PyAny>,
    events: &Bound<'_, PyAny>,
    lease_generation: &Bound<'_, PyAny>,
    entry: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let generation = integer(lease_generation, "lease_generation")?;
    let events = text(events)?;
    let entry = text(entry)?;
    PolicyArg::of(policy)?.with(|cp| api::journal_append_compiled(cp, &events, generation, &entry))
}

/// `journal_classify`: `append`, `duplicate` or `evidence` (JSON) for an event offered to a journal.
#[pyfunction]
fn journal_classify(
    policy: &Bound<'_, PyAny>,
    events: &Bound<'_, PyAny>,
    event: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let events = text(events)?;
    let event = text(event)?;
    PolicyArg::of(policy)?.with(|cp| api::journal_classify_compiled(cp, &events, &event))
}

/// `idempotency_claim`: `proceed`, `replay`, `poll` or `rejected` (JSON) for a request under its key.
#[pyfunction]
#[pyo3(signature = (retention, record, request, now_epoch_ms))]
fn idempotency_claim(
    retention: &Bound<'_, PyAny>,
    record: Option<&Bound<'_, PyAny>>,
    request: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    let rec = opt_text(record)?;
    lift(api::idempotency_claim(
        &text(retention)?,
        rec.as_deref(),
        &text(request)?,
        now,
    ))
}

/// `idempotency_complete`: the claimed record (JSON) moved to its final status.
#[pyfunction]
fn idempotency_complete(
    retention: &Bound<'_, PyAny>,
    record: &Bound<'_, PyAny>,
    completion: &Bound<'_, PyAny>,
    now_epoch_ms: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let now = integer(now_epoch_ms, "now_epoch_ms")?;
    lift(api::idempotency_complete(
        &text(retention)?,
        &text(record)?,
        &text(completion)?,
        now,
    ))
}

/// `request_sha256`: a logical request's digest (full RFC 8785).
#[pyfunction]
fn request_sha256(request: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::request_sha256(&text(request)?))
}

/// `build_policy`: the validated policy (JSON) built from a logical request and a policy spec.
#[pyfunction]
fn build_policy(request: &Bound<'_, PyAny>, spec: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::build_policy(&text(request)?, &text(spec)?))
}

/// `check_price_schedule`: the schedule's digest once checked against the policy.
#[pyfunction]
fn check_price_schedule(
    policy: &Bound<'_, PyAny>,
    schedule: &Bound<'_, PyAny>,
) -> PyResult<String> {
    lift(api::check_price_schedule(&text(policy)?, &text(schedule)?))
}

/// `price_cost`: what raw usage costs on a release under a price schedule.
#[pyfunction]
fn price_cost(
    schedule: &Bound<'_, PyAny>,
    route_release_sha256: &Bound<'_, PyAny>,
    usage: &Bound<'_, PyAny>,
) -> PyResult<u64> {
    lift(api::price_cost(
        &text(schedule)?,
        &text(route_release_sha256)?,
        &text(usage)?,
    ))
}

/// `lift_request`: the logical request (canonical JSON) of an SDK call's parameters.
#[pyfunction]
fn lift_request(call: &Bound<'_, PyAny>, params: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::lift_request(&text(call)?, &text(params)?))
}

/// `check_sent_request`: an SDK call about to be sent (its URL path and
/// JSON body) against the logical request its policy binds; `request_drift`
/// when it lifts to another request.
#[pyfunction]
fn check_sent_request(
    request: &Bound<'_, PyAny>,
    url_path: &str,
    body: &Bound<'_, PyAny>,
) -> PyResult<()> {
    lift(api::check_sent_request(
        &text(request)?,
        url_path,
        text(body)?.as_bytes(),
    ))
}

/// `lower_request`: a conversation request lowered for a route release
/// (`{"api", "body", "body_sha256", "model", "notes"}`), or why the route
/// cannot serve it.
#[pyfunction]
#[pyo3(signature = (request, release, options = None))]
fn lower_request(
    request: &Bound<'_, PyAny>,
    release: &Bound<'_, PyAny>,
    options: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let options = match options {
        Some(o) => text(o)?,
        None => "{}".into(),
    };
    lift(api::lower_request(
        &text(request)?,
        &text(release)?,
        &options,
    ))
}

/// `route_capabilities`: whether each route of a policy spec can serve a request.
#[pyfunction]
fn route_capabilities(request: &Bound<'_, PyAny>, spec: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::route_capabilities(&text(request)?, &text(spec)?))
}

/// `lower_routes`: the request lowered for each route of a spec that can
/// serve it, in order (`{"routes": [{"route_id", "lowered"}]}`).
#[pyfunction]
fn lower_routes(request: &Bound<'_, PyAny>, spec: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::lower_routes(&text(request)?, &text(spec)?))
}

/// `canonical_request`: a logical request's RFC 8785 canonical JSON.
#[pyfunction]
fn canonical_request(request: &Bound<'_, PyAny>) -> PyResult<String> {
    lift(api::canonical_request(&text(request)?))
}

/// `idempotency_key_sha256`: a bare or scoped idempotency key's digest.
#[pyfunction]
#[pyo3(signature = (key, tenant=None, operation=None))]
fn idempotency_key_sha256(
    key: &Bound<'_, PyAny>,
    tenant: Option<&Bound<'_, PyAny>>,
    operation: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let tenant = tenant.map(|t| text(t)).transpose()?;
    let operation = operation.map(|o| text(o)).transpose()?;
    lift(api::idempotency_key_sha256(
        &text(key)?,
        tenant.as_deref(),
        operation.as_deref(),
    ))
}

/// The replay lab: the report (canonical JSON), its summary table and its case table.
#[pyfunction]
fn lab() -> PyResult<(String, String, String)> {
    lift(api::lab())
}

// ---- outcomes, facts, judgements -------------------------------------------

/// An outcome, decoded strictly once.
#[pyclass(frozen, name = "Outcome", module = "retryledger._core")]
struct PyOutcome {
    inner: Outcome,
}

/// An outcome from an `Outcome`, JSON text or a dict, decoded by the core.
fn outcome_of(obj: &Bound<'_, PyAny>) -> PyResult<Outcome> {
    if let Ok(o) = obj.cast::<PyOutcome>() {
        return Ok(o.get().inner);
    }
    if obj.is_instance_of::<PyString>() {
        return lift(from_str::<Outcome>(&text(obj)?));
    }
    lift(value_of(obj, &At::Root, 0).and_then(from_value::<Outcome>))
}

#[pymethods]
impl PyOutcome {
    #[new]
    fn new(outcome: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: outcome_of(outcome)?,
        })
    }

    /// The outcome as canonical JSON.
    #[getter]
    fn json(&self) -> String {
        canonical_json(&self.inner)
    }

    /// The outcome document as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyOutcome>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        canonical_json(&self.inner).hash(&mut h);
        h.finish() >> 1
    }

    fn __repr__(&self) -> String {
        format!("Outcome({})", canonical_json(&self.inner))
    }
}

/// What a host observed of one attempt, validated by the core's decoder.
#[pyclass(frozen, name = "Facts", module = "retryledger._core")]
struct PyFacts {
    inner: Facts,
    /// The judgement the first observation of these facts made, shared by
    /// later observations that make the same one (a judgement is
    /// immutable): the facts of an error raised again and again are judged
    /// into one object, not one per attempt.
    judged: PyOnceLock<Py<PyJudgement>>,
}

#[pymethods]
impl PyFacts {
    #[new]
    #[pyo3(signature = (
        *,
        result,
        outcome = None,
        error_types = None,
        error_codes = None,
        status = None,
        headers = None,
        response_bytes_received = None,
        cancelled = None,
        now_unix_ms = None,
        transport_error = None,
        deadline_passed = None,
        stream = None,
        error_body = None,
        provider_family = None,
        output_checks = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        result: &Bound<'_, PyAny>,
        outcome: Option<&Bound<'_, PyAny>>,
        error_types: Option<&Bound<'_, PyAny>>,
        error_codes: Option<&Bound<'_, PyAny>>,
        status: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
        response_bytes_received: Option<&Bound<'_, PyAny>>,
        cancelled: Option<&Bound<'_, PyAny>>,
        now_unix_ms: Option<&Bound<'_, PyAny>>,
        transport_error: Option<&Bound<'_, PyAny>>,
        deadline_passed: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        error_body: Option<&Bound<'_, PyAny>>,
        provider_family: Option<&Bound<'_, PyAny>>,
        output_checks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut map = Map::new();
        let mut typed_outcome = None;
        let fields = [
            ("cancelled", cancelled),
            ("deadline_passed", deadline_passed),
            ("error_body", error_body),
            ("error_codes", error_codes),
            ("error_types", error_types),
            ("now_unix_ms", now_unix_ms),
            ("output_checks", output_checks),
            ("provider_family", provider_family),
            ("response_bytes_received", response_bytes_received),
            ("result", Some(result)),
            ("status", status),
            ("stream", stream),
            ("transport_error", transport_error),
        ];
        for (name, given) in fields {
            if let Some(v) = given.filter(|v| !v.is_none()) {
                map.insert(
                    name.to_owned(),
                    lift(value_of(v, &At::Key(&At::Root, name), 1))?,
                );
            }
        }
        if let Some(h) = headers.filter(|v| !v.is_none()) {
            let at = At::Key(&At::Root, "headers");
            let value = match h.cast::<PyDict>() {
                Ok(d) => {
                    let pairs = d
                        .iter()
                        .map(|(k, v)| PyTuple::new(h.py(), [k, v]).map(Bound::into_any))
                        .collect::<PyResult<Vec<_>>>()?;
                    lift(value_of(PyList::new(h.py(), pairs)?.as_any(), &at, 1))?
                }
                Err(_) => lift(value_of(h, &at, 1))?,
            };
            map.insert("headers".to_owned(), value);
        }
        if let Some(o) = outcome.filter(|v| !v.is_none()) {
            let at = At::Key(&At::Root, "outcome");
            if let Ok(o) = o.cast::<PyOutcome>() {
                typed_outcome = Some(o.get().inner);
            } else if o.is_instance_of::<PyString>() {
                map.insert("outcome".to_owned(), lift(parse_strict(&text(o)?))?);
            } else {
                map.insert("outcome".to_owned(), lift(value_of(o, &at, 1))?);
            }
        }
        let mut inner = lift(from_value::<Facts>(Value::Object(map)))?;
        if typed_outcome.is_some() {
            inner.outcome = typed_outcome;
        }
        Ok(Self {
            inner,
            judged: PyOnceLock::new(),
        })
    }

    /// The facts as canonical JSON (what `judge` reads).
    #[getter]
    fn json(&self) -> String {
        canonical_json(&self.inner)
    }

    /// The facts document as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!("Facts({})", canonical_json(&self.inner))
    }
}

/// The core's judgement of one attempt: its outcome and the deciding rule.
#[pyclass(frozen, name = "Judgement", module = "retryledger._core")]
struct PyJudgement {
    inner: Judgement,
}

#[pymethods]
impl PyJudgement {
    /// The outcome recorded for the attempt.
    #[getter]
    fn outcome(&self) -> PyOutcome {
        PyOutcome {
            inner: self.inner.outcome,
        }
    }

    /// The rule that decided it (`returned`, `explicit`, ..., `unrecognized`).
    #[getter]
    fn rule(&self) -> &'static str {
        self.inner.rule.as_str()
    }

    /// What a provider-aware reading ignored, and why (docs/PROVIDERS.md);
    /// empty when nothing was.
    #[getter]
    fn notes(&self) -> Vec<&'static str> {
        self.inner
            .notes
            .as_ref()
            .map(|n| n.0.iter().map(|x| x.as_str()).collect())
            .unwrap_or_default()
    }

    /// For a streamed run: what the host does with the consumer's events
    /// (`commit`, `invalidate`, `continue` or `none`); `None` otherwise.
    #[getter]
    fn stream(&self) -> Option<&'static str> {
        self.inner.stream.map(|a| a.as_str())
    }

    /// `{"notes"?: [...], "outcome": {...}, "rule": "...", "stream"?: "..."}`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.inner)
    }

    fn __repr__(&self) -> String {
        format!("Judgement({})", canonical_json(&self.inner))
    }
}

// ---- decisions ---------------------------------------------------------------

/// A planned attempt: the `dispatch` decision's fields as attributes.
#[pyclass(frozen, name = "Dispatch", module = "retryledger._core")]
struct PyDispatch {
    d: Dispatch,
}

#[pymethods]
impl PyDispatch {
    /// Always `"dispatch"`.
    #[getter]
    fn kind(&self) -> &'static str {
        "dispatch"
    }
    /// Global ordinal, from 1.
    #[getter]
    fn ordinal(&self) -> u64 {
        self.d.ordinal
    }
    /// The route to dispatch to.
    #[getter]
    fn route_id(&self) -> &str {
        self.d.route_id.as_str()
    }
    /// Ordinal on the route, from 1.
    #[getter]
    fn route_ordinal(&self) -> u64 {
        self.d.route_ordinal
    }
    /// Earliest start on the run clock, ms.
    #[getter]
    fn not_before_ms(&self) -> u64 {
        self.d.not_before_ms
    }
    /// For a streamed run: the provider response this attempt resumes, as
    /// `{"continues_ordinal", "response_id", "starting_after"}`; else `None`.
    #[getter]
    fn continuation<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.d
            .continuation
            .as_ref()
            .map(|c| to_py(py, c))
            .transpose()
    }
    /// The delay from the previous completion, ms.
    #[getter]
    fn delay_ms(&self) -> u64 {
        self.d.delay_ms
    }
    /// For an async job: `{"kind": "submit"}`, or a poll as `{"job_sha256",
    /// "kind": "poll", "poll"}`; else `None`.
    #[getter]
    fn job<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.d.job.as_ref().map(|j| to_py(py, j)).transpose()
    }
    /// Cost reserved for the attempt.
    #[getter]
    fn reserve_cost(&self) -> u64 {
        self.d.reserve_cost
    }
    /// The run's deadline on the run clock, ms.
    #[getter]
    fn deadline_ms(&self) -> u64 {
        self.d.deadline_ms
    }
    /// The bounded Retry-After floor that applied, ms.
    #[getter]
    fn retry_after_floor_ms(&self) -> u64 {
        self.d.retry_after_floor_ms
    }
    /// The route release the policy names.
    #[getter]
    fn route_release_sha256(&self) -> &str {
        self.d.route_release_sha256.as_str()
    }
    /// Digest of the logical request.
    #[getter]
    fn logical_request_sha256(&self) -> &str {
        self.d.logical_request_sha256.as_str()
    }
    /// Digest of the idempotency key.
    #[getter]
    fn idempotency_key_sha256(&self) -> &str {
        self.d.idempotency_key_sha256.as_str()
    }
    /// Jitter interval lower end, when jitter is on.
    #[getter]
    fn jitter_min_ms(&self) -> Option<u64> {
        self.d.jitter_min_ms
    }
    /// Jitter interval upper end, when jitter is on.
    #[getter]
    fn jitter_max_ms(&self) -> Option<u64> {
        self.d.jitter_max_ms
    }
    /// The jitter sample the attempt records, when jitter is on.
    #[getter]
    fn jitter_sample_ms(&self) -> Option<u64> {
        self.d.jitter_sample_ms
    }
    /// The decision document (`plan_next`'s answer) as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &Decision::Dispatch(self.d.clone()))
    }
    fn __repr__(&self) -> String {
        format!(
            "Dispatch(ordinal={}, route_id='{}', route_ordinal={}, not_before_ms={})",
            self.d.ordinal,
            self.d.route_id.as_str(),
            self.d.route_ordinal,
            self.d.not_before_ms
        )
    }
}

/// The run is over: the `terminal` decision.
#[pyclass(frozen, name = "Terminal", module = "retryledger._core")]
struct PyTerminal {
    terminal: &'static str,
    decision: Decision,
}

#[pymethods]
impl PyTerminal {
    /// Always `"terminal"`.
    #[getter]
    fn kind(&self) -> &'static str {
        "terminal"
    }
    /// How the run ended.
    #[getter]
    fn terminal(&self) -> &'static str {
        self.terminal
    }
    /// The decision document as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.decision)
    }
    fn __repr__(&self) -> String {
        format!("Terminal(terminal='{}')", self.terminal)
    }
}

fn decision_object(py: Python<'_>, decision: &Decision) -> PyResult<Py<PyAny>> {
    Ok(match decision {
        Decision::Dispatch(d) => Py::new(py, PyDispatch { d: d.clone() })?.into_any(),
        Decision::Terminal { terminal } => Py::new(
            py,
            PyTerminal {
                terminal: terminal.as_str(),
                decision: decision.clone(),
            },
        )?
        .into_any(),
    })
}

// ---- policies, sessions, sealed runs ----------------------------------------

/// A policy validated and digested once, reused for every plan, evaluation and run.
#[pyclass(frozen, module = "retryledger._core")]
struct Compiled {
    inner: Arc<CompiledPolicy>,
    policy_json: String,
    /// The logical request a template bound, against which each SDK call
    /// the run sends is checked (`check_sent`); `None` for a policy given whole.
    request: Option<Arc<retryledger_core::request::Request>>,
}

#[pymethods]
impl Compiled {
    #[new]
    fn new(policy: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = lift(api::compile_policy(&text(policy)?))?;
        let policy_json = canonical_json(&inner.policy);
        Ok(Self {
            inner: Arc::new(inner),
            policy_json,
            request: None,
        })
    }

    /// The policy digest.
    #[getter]
    fn sha256(&self) -> &str {
        &self.inner.policy_sha256
    }

    /// The digest of the idempotency key every attempt carries.
    #[getter]
    fn idempotency_key_sha256(&self) -> &str {
        self.inner.policy.idempotency_key_sha256.as_str()
    }

    /// The policy as canonical JSON.
    #[getter]
    fn policy_json(&self) -> &str {
        &self.policy_json
    }

    /// `plan_next` against this policy.
    fn plan_next(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::plan_next_compiled(&self.inner, &text(attempts)?))
    }

    /// `evaluate` against this policy.
    fn evaluate(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::evaluate_compiled(&self.inner, &text(attempts)?))
    }

    /// Seal a finished run: the bundle as JSON.
    fn seal(&self, attempts: &Bound<'_, PyAny>) -> PyResult<String> {
        lift(api::seal_compiled(&self.inner, &text(attempts)?))
    }

    /// Refuse, before any dispatch, a route without a client: `route_ids`
    /// are the routes the host has a client for (`route_client_missing`).
    fn require_clients(&self, route_ids: Vec<String>) -> PyResult<()> {
        lift(
            self.inner
                .require_clients(|id| route_ids.iter().any(|r| r == id)),
        )
    }

    /// Refuse, before any dispatch, a fleet that does not fit the policy:
    /// `given` is whether the caller passed one (`admission_missing`,
    /// `admission_unexpected`).
    fn require_fleet(&self, given: bool) -> PyResult<()> {
        lift(self.inner.require_fleet(given))
    }

    /// Refuse, before any dispatch, a section the driver named `driver`
    /// cannot carry (docs/COMPOSITION.md, "What a driver carries").
    fn require_driver(&self, driver: &str) -> PyResult<()> {
        lift(
            retryledger_core::host::Driver::parse(driver)
                .and_then(|d| self.inner.require_driver(d)),
        )
    }

    /// Refuse, before any dispatch, an async job without a cancel call
    /// under `cancel_left_running` (`invalid_async_job`).
    fn require_job_calls(&self, has_cancel: bool) -> PyResult<()> {
        lift(self.inner.require_job_calls(has_cancel))
    }

    /// Check an SDK call a run of this policy is about to send (its URL
    /// path and JSON body) against the logical request a template bound
    /// (`request_drift`); nothing to check for a policy given whole.
    fn check_sent(&self, url_path: &str, body: &[u8]) -> PyResult<()> {
        match &self.request {
            Some(request) => lift(retryledger_core::lift::check_sent(request, url_path, body)),
            None => Ok(()),
        }
    }

    /// A run of this policy with no attempt yet.
    fn session(slf: Py<Self>, py: Python<'_>) -> PySession {
        PySession {
            session: Session::start(Arc::clone(&slf.get().inner)),
            policy: slf.clone_ref(py),
            next: None,
        }
    }
}

/// A policy spec compiled once (`compile_policy_template`), bound per call.
#[pyclass(frozen, name = "PolicyTemplate", module = "retryledger._core")]
struct PyPolicyTemplate {
    inner: retryledger_core::template::PolicyTemplate,
}

#[pymethods]
impl PyPolicyTemplate {
    /// Compile a policy spec without `idempotency_key_sha256`.
    #[new]
    fn new(spec: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            inner: lift(api::compile_policy_template(&text(spec)?))?,
        })
    }

    /// The policy of one call: a logical request (JSON text) and the
    /// idempotency key's digest; the same document and digest as `build_policy`.
    fn bind(
        &self,
        request: &Bound<'_, PyAny>,
        idempotency_key_sha256: &Bound<'_, PyAny>,
    ) -> PyResult<Compiled> {
        let (inner, policy_json, request) = lift(api::bind_policy_template_request(
            &self.inner,
            &text(request)?,
            &text(idempotency_key_sha256)?,
        ))?;
        Ok(Compiled {
            inner: Arc::new(inner),
            policy_json,
            request: Some(Arc::new(request)),
        })
    }
}

/// The facts `observe` judges: a `Facts`, or a coded error.
fn facts_arg<'a, 'py>(facts: Option<&'a Bound<'py, PyAny>>) -> PyResult<&'a Bound<'py, PyFacts>> {
    facts.and_then(|f| f.cast::<PyFacts>().ok()).ok_or_else(|| {
        coded(
            ErrorCode::MissingField,
            "/facts",
            "observe needs the attempt's facts (a Facts)",
        )
    })
}

/// One run in progress: the core's [`Session`], advanced one observed attempt at a time.
#[pyclass(name = "Session", module = "retryledger._core")]
struct PySession {
    session: Session,
    policy: Py<Compiled>,
    /// The current decision's object, made on the first `next()` after a change.
    next: Option<Py<PyAny>>,
}

impl PySession {
    /// `observe` with its arguments checked: the core judges `facts` and
    /// records the attempt; the judgement object (the facts' own when the same).
    fn observed(
        &mut self,
        py: Python<'_>,
        started: u64,
        completed: u64,
        cost: Option<u64>,
        facts: &Bound<'_, PyFacts>,
        deltas: &[String],
    ) -> PyResult<Py<PyJudgement>> {
        let judgement = lift(self.session.observe_stream(
            started,
            completed,
            cost,
            &facts.get().inner,
            deltas,
        ))?;
        self.next = None;
        // The facts' judgement object when this one is the same, else a new one.
        let facts = facts.get();
        if let Some(j) = facts.judged.get(py) {
            if j.get().inner == judgement {
                return Ok(j.clone_ref(py));
            }
            return Py::new(py, PyJudgement { inner: judgement });
        }
        let j = Py::new(py, PyJudgement { inner: judgement })?;
        Ok(facts
            .judged
            .get_or_init(py, || j.clone_ref(py))
            .clone_ref(py))
    }
}

#[pymethods]
impl PySession {
    /// The decision: a `Dispatch` (what to dispatch next and not before when)
    /// or a `Terminal`.
    fn next(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(d) = &self.next {
            return Ok(d.clone_ref(py));
        }
        let d = decision_object(py, self.session.next())?;
        self.next = Some(d.clone_ref(py));
        Ok(d)
    }

    /// The core judges `facts`, charges `cost` (the planned `reserve_cost`
    /// when `None`) and records the planned attempt. Drift (an early start, a
    /// completion before the start, an attempt after the terminal) raises and
    /// leaves the session unchanged.
    ///
    /// For a streamed run, `deltas` are the texts of the events the attempt
    /// received, in order; the judgement's `stream` says what to do with them.
    #[pyo3(signature = (started_at_ms, completed_at_ms, cost = None, facts = None, deltas = None))]
    fn observe(
        &mut self,
        py: Python<'_>,
        started_at_ms: &Bound<'_, PyAny>,
        completed_at_ms: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        facts: Option<&Bound<'_, PyAny>>,
        deltas: Option<Vec<String>>,
    ) -> PyResult<Py<PyJudgement>> {
        let facts = facts_arg(facts)?;
        let started = integer(started_at_ms, "started_at_ms")?;
        let completed = integer(completed_at_ms, "completed_at_ms")?;
        let cost = match cost.filter(|c| !c.is_none()) {
            Some(c) => Some(integer(c, "cost")?),
            None => None,
        };
        self.observed(
            py,
            started,
            completed,
            cost,
            facts,
            &deltas.unwrap_or_default(),
        )
    }

    /// Admit the planned attempt under the fleet view read from the store
    /// at `now_epoch_ms` (`{"breakers": {release: snapshot}, "budget"?,
    /// "store_unavailable"?}`, a dict or JSON), `at_ms` on the run clock:
    /// `{"decision": …, "writes": …}` as a dict.
    fn admit<'py>(
        &mut self,
        py: Python<'py>,
        at_ms: &Bound<'_, PyAny>,
        now_epoch_ms: &Bound<'_, PyAny>,
        view: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let at = integer(at_ms, "at_ms")?;
        let now = integer(now_epoch_ms, "now_epoch_ms")?;
        let view = lift(from_str::<retryledger_core::fleet::FleetView>(&text(view)?))?;
        let admitted = lift(self.session.admit(at, now, &view))?;
        self.next = None;
        to_py(py, &admitted)
    }

    /// What `admit` would answer under `view`, the session unchanged (a dict).
    fn admit_preview<'py>(
        &self,
        py: Python<'py>,
        at_ms: &Bound<'_, PyAny>,
        now_epoch_ms: &Bound<'_, PyAny>,
        view: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let at = integer(at_ms, "at_ms")?;
        let now = integer(now_epoch_ms, "now_epoch_ms")?;
        let view = lift(from_str::<retryledger_core::fleet::FleetView>(&text(view)?))?;
        to_py(py, &lift(self.session.admit_preview(at, now, &view))?)
    }

    /// The last attempt's breaker after its outcome, from the snapshot read
    /// now (a dict or JSON): the next snapshot as a dict.
    fn breaker_after<'py>(
        &self,
        py: Python<'py>,
        snapshot: &Bound<'_, PyAny>,
        now_epoch_ms: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let now = integer(now_epoch_ms, "now_epoch_ms")?;
        let snapshot = lift(from_str::<retryledger_core::breaker::BreakerSnapshot>(
            &text(snapshot)?,
        ))?;
        to_py(py, &lift(self.session.breaker_after(&snapshot, now))?)
    }

    /// The admitted attempt's admission snapshot once it is over, from the
    /// snapshot read now (a dict or JSON): its in-flight slot freed and its
    /// reserved tokens settled with `used_tokens` (None: not reported), then
    /// the rate-limit `headers` of its response (JSON text of `[name,
    /// value]` pairs, optional) applied; the next snapshot as a dict.
    #[pyo3(signature = (snapshot, now_epoch_ms, used_tokens=None, headers=None))]
    fn admission_release<'py>(
        &self,
        py: Python<'py>,
        snapshot: &Bound<'_, PyAny>,
        now_epoch_ms: &Bound<'_, PyAny>,
        used_tokens: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let now = integer(now_epoch_ms, "now_epoch_ms")?;
        let used = used_tokens
            .filter(|u| !u.is_none())
            .map(|u| integer(u, "used_tokens"))
            .transpose()?;
        let snapshot = lift(from_str::<retryledger_core::admission::AdmissionSnapshot>(
            &text(snapshot)?,
        ))?;
        let headers = match headers.filter(|h| !h.is_none()) {
            Some(h) => lift(
                from_str::<retryledger_core::admission::SeenHeaders>(&text(h)?)
                    .map_err(|e| e.under("/headers")),
            )?,
            None => retryledger_core::admission::SeenHeaders::default(),
        };
        to_py(
            py,
            &lift(
                self.session
                    .admission_release_seen(&snapshot, now, used, &headers.0),
            )?,
        )
    }

    /// Price the run's usage with `schedule` (a `retryledger.price_schedule.v1`
    /// as JSON text), checked against the policy; only before the first
    /// attempt. The receipt then binds its digest and the bundle carries it.
    fn set_price_schedule(&mut self, schedule: &Bound<'_, PyAny>) -> PyResult<()> {
        let schedule = lift(from_str::<retryledger_core::price::PriceSchedule>(&text(
            schedule,
        )?))?;
        lift(self.session.set_price_schedule(Arc::new(schedule)))
    }

    /// Report usage (units by kind, as JSON text) of the attempt in
    /// flight; reports add up. Returns what the attempt's usage so far costs.
    fn add_usage(&mut self, usage: &Bound<'_, PyAny>) -> PyResult<u64> {
        let usage = lift(from_str::<retryledger_core::price::Units>(&text(usage)?))?;
        lift(self.session.add_usage(&usage))
    }

    /// Continue the run a journal (JSON text of its events) holds: the core
    /// verifies it against this session's policy; only a fresh session resumes.
    fn resume_journal(&mut self, events: &Bound<'_, PyAny>) -> PyResult<()> {
        lift(api::session_resume_journal(
            &mut self.session,
            &text(events)?,
        ))?;
        self.next = None;
        Ok(())
    }

    /// Report what the attempt in flight was of an async job: the provider's
    /// job id (the core keeps only its SHA-256) and the status its answer
    /// reported (`queued`, `in_progress`, `completed`, ...).
    #[pyo3(signature = (id=None, status=None))]
    fn set_job(&mut self, id: Option<&str>, status: Option<&str>) -> PyResult<()> {
        let status = match status {
            Some(s) => Some(lift(retryledger_core::job::JobStatus::parse(s))?),
            None => None,
        };
        self.session.set_job(id, status);
        Ok(())
    }

    /// Report the receiver's answer for the attempt in flight, reconciled by
    /// idempotency key (`succeeded`, `failed_no_effect`, `unknown`).
    fn set_reconciled(&mut self, answer: &str) -> PyResult<()> {
        let answer = lift(retryledger_core::job::reconciled_named(answer))?;
        self.session.set_reconciled(answer);
        Ok(())
    }

    /// Check an SDK call the attempt in flight is about to send (its URL
    /// path and JSON body) against the logical request a template bound:
    /// `request_drift` when it lifts to another one. A policy given whole
    /// binds no request to compare with.
    fn check_sent(&self, url_path: &str, body: &[u8]) -> PyResult<()> {
        match &self.policy.get().request {
            Some(request) => lift(retryledger_core::lift::check_sent(request, url_path, body)),
            None => Ok(()),
        }
    }

    /// Report the SHA-256 (lowercase hex) of the request body the attempt in flight sent.
    fn set_request_body_sha256(&mut self, digest: &str) -> PyResult<()> {
        let digest = lift(
            retryledger_core::ids::Sha256Hex::parse(digest)
                .map_err(|m| Error::at(ErrorCode::InvalidDigest, "/request_body_sha256", m)),
        )?;
        self.session.set_request_body_sha256(digest);
        Ok(())
    }

    /// Report the model the attempt in flight asked for (`requested`, the
    /// lowered request's model) and the one the provider's answer named
    /// (`served`). A side not known is `None`: recorded as unknown, never
    /// invented. A `requested` model that is not an identifier is a coded
    /// error; a `served` one the provider reported in another alphabet is
    /// not a model name the receipt can hold, so it is recorded as unknown.
    #[pyo3(signature = (requested=None, served=None))]
    fn set_model(&mut self, requested: Option<&str>, served: Option<&str>) -> PyResult<()> {
        let requested = match requested {
            Some(r) => Some(
                retryledger_core::ids::Identifier::parse(r)
                    .map_err(|(code, m)| coded(code, "/model/requested", &m))?,
            ),
            None => None,
        };
        let served = served.and_then(|s| retryledger_core::ids::Identifier::parse(s).ok());
        self.session.set_model(requested, served);
        Ok(())
    }

    /// Mark the run cancelled between attempts, at `at_ms` on the run clock.
    fn cancel(&mut self, at_ms: &Bound<'_, PyAny>) -> PyResult<()> {
        let at = integer(at_ms, "at_ms")?;
        lift(self.session.cancel(at))?;
        self.next = None;
        Ok(())
    }

    /// The terminal's name, or `None` while the run can still dispatch.
    #[getter]
    fn terminal(&self) -> Option<&'static str> {
        match self.session.next() {
            Decision::Terminal { terminal } => Some(terminal.as_str()),
            Decision::Dispatch(_) => None,
        }
    }

    /// The attempts document so far, as a dict.
    #[getter]
    fn attempts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, self.session.attempts())
    }

    /// The stream events the consumer received so far, as dicts (a streamed run).
    #[getter]
    fn stream_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(
            py,
            &retryledger_core::stream::StreamEvents(self.session.stream_events()),
        )
    }

    /// Seal the finished run (an error while it can still dispatch).
    fn seal(slf: &Bound<'_, Self>) -> PyResult<Sealed> {
        let py = slf.py();
        let this = slf.borrow();
        let stream_events = this
            .session
            .policy()
            .policy
            .stream
            .as_ref()
            .map(|_| retryledger_core::stream::StreamEvents(this.session.stream_events()));
        let fleet_snapshots = this
            .session
            .policy()
            .policy
            .fleet
            .as_ref()
            .map(|_| this.session.fleet_snapshots().clone());
        Ok(Sealed {
            receipt: lift(this.session.receipt())?,
            // A finished session's attempts no longer change: read from it, not copied.
            attempts: slf.clone().unbind(),
            fleet_snapshots,
            price_schedule: this.session.price_schedule().cloned(),
            stream_events,
            policy: this.policy.clone_ref(py),
            receipt_dict: PyOnceLock::new(),
            receipt_sha256: OnceLock::new(),
            bundle_json: OnceLock::new(),
        })
    }
}

/// A sealed run: policy, attempts and the evaluated receipt.
#[pyclass(frozen, module = "retryledger._core")]
struct Sealed {
    policy: Py<Compiled>,
    /// The finished session, which holds the attempts.
    attempts: Py<PySession>,
    fleet_snapshots: Option<retryledger_core::fleet::FleetSnapshots>,
    price_schedule: Option<retryledger_core::price::PriceSchedule>,
    stream_events: Option<retryledger_core::stream::StreamEvents>,
    receipt: Receipt,
    receipt_dict: PyOnceLock<Py<PyAny>>,
    receipt_sha256: OnceLock<String>,
    bundle_json: OnceLock<String>,
}

/// A bundle's canonical JSON from its parts' canonical JSON (fields in sorted order).
fn bundle_text(
    attempts_json: &str,
    fleet_snapshots_json: Option<&str>,
    policy_json: &str,
    price_schedule_json: Option<&str>,
    receipt_json: &str,
    stream_events_json: Option<&str>,
) -> String {
    let fleet = fleet_snapshots_json
        .map(|f| format!(",\"fleet_snapshots\":{f}"))
        .unwrap_or_default();
    let prices = price_schedule_json
        .map(|p| format!(",\"price_schedule\":{p}"))
        .unwrap_or_default();
    let events = stream_events_json
        .map(|e| format!(",\"stream_events\":{e}"))
        .unwrap_or_default();
    format!(
        "{{\"attempts\":{attempts_json}{fleet},\"policy\":{policy_json}{prices},\"receipt\":{receipt_json},\"schema\":\"{}\"{events}}}",
        BundleSchema::NAME
    )
}

impl Sealed {
    /// `f` of the run's attempts (held by the finished session).
    fn with_attempts<R>(&self, py: Python<'_>, f: impl FnOnce(&Attempts) -> R) -> PyResult<R> {
        let session = self.attempts.bind(py).try_borrow()?;
        Ok(f(session.session.attempts()))
    }
}

#[pymethods]
impl Sealed {
    /// How the run ended.
    #[getter]
    fn terminal(&self) -> &'static str {
        self.receipt.terminal.as_str()
    }

    /// The receipt as a dict (built once, in canonical key order).
    #[getter]
    fn receipt(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let d = self
            .receipt_dict
            .get_or_try_init(py, || to_py(py, &self.receipt).map(Bound::unbind))?;
        Ok(d.clone_ref(py))
    }

    /// Lowercase hex SHA-256 of the receipt's canonical JSON.
    #[getter]
    fn receipt_sha256(&self) -> &str {
        self.receipt_sha256.get_or_init(|| digest_of(&self.receipt))
    }

    /// The receipt as canonical JSON.
    #[getter]
    fn receipt_json(&self) -> String {
        canonical_json(&self.receipt)
    }

    /// The attempts document as a dict.
    #[getter]
    fn attempts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.with_attempts(py, |a| to_py(py, a))?
    }

    /// The bundle (attempts, policy, receipt) as canonical JSON.
    #[getter]
    fn bundle_json(&self, py: Python<'_>) -> PyResult<&str> {
        if let Some(text) = self.bundle_json.get() {
            return Ok(text);
        }
        let attempts = self.with_attempts(py, canonical_json)?;
        Ok(self.bundle_json.get_or_init(|| {
            bundle_text(
                &attempts,
                self.fleet_snapshots.as_ref().map(canonical_json).as_deref(),
                &self.policy.get().policy_json,
                self.price_schedule.as_ref().map(canonical_json).as_deref(),
                &canonical_json(&self.receipt),
                self.stream_events.as_ref().map(canonical_json).as_deref(),
            )
        }))
    }

    /// The bundle as a dict (a new one on each access).
    #[getter]
    fn bundle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("attempts", self.with_attempts(py, |a| to_py(py, a))??)?;
        if let Some(f) = &self.fleet_snapshots {
            d.set_item("fleet_snapshots", to_py(py, f)?)?;
        }
        d.set_item("policy", to_py(py, &self.policy.get().inner.policy)?)?;
        if let Some(p) = &self.price_schedule {
            d.set_item("price_schedule", to_py(py, p)?)?;
        }
        d.set_item("receipt", to_py(py, &self.receipt)?)?;
        d.set_item("schema", BundleSchema::NAME)?;
        if let Some(events) = &self.stream_events {
            d.set_item("stream_events", to_py(py, events)?)?;
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_text_is_the_canonical_bundle() -> retryledger_core::Result<()> {
        let bundle = retryledger_core::lab::reference_bundle()?;
        let text = bundle_text(
            &canonical_json(&bundle.attempts),
            None,
            &canonical_json(&bundle.policy),
            None,
            &canonical_json(&bundle.receipt),
            None,
        );
        assert_eq!(text, canonical_json(&bundle));
        Ok(())
    }
}

/// The extension module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add_class::<Compiled>()?;
    m.add_class::<PySession>()?;
    m.add_class::<PyDispatch>()?;
    m.add_class::<PyTerminal>()?;
    m.add_class::<PyFacts>()?;
    m.add_class::<PyJudgement>()?;
    m.add_class::<PyOutcome>()?;
    m.add_class::<Sealed>()?;
    m.add_class::<hedge::PyHedgeSession>()?;
    m.add_class::<drive::SyncLoop>()?;
    m.add_class::<journal::PyJournalWriter>()?;
    m.add_function(wrap_pyfunction!(validate_policy, m)?)?;
    m.add_function(wrap_pyfunction!(plan_next, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(verify_bundle, m)?)?;
    m.add_function(wrap_pyfunction!(digest, m)?)?;
    m.add_function(wrap_pyfunction!(parse_retry_after, m)?)?;
    m.add_function(wrap_pyfunction!(classify_http, m)?)?;
    m.add_function(wrap_pyfunction!(judge, m)?)?;
    m.add_function(wrap_pyfunction!(next_repair, m)?)?;
    m.add_function(wrap_pyfunction!(repair_step, m)?)?;
    m.add_function(wrap_pyfunction!(check_model, m)?)?;
    m.add_function(wrap_pyfunction!(verify_repair_chain, m)?)?;
    m.add_function(wrap_pyfunction!(breaker_admit, m)?)?;
    m.add_function(wrap_pyfunction!(breaker_record, m)?)?;
    m.add_function(wrap_pyfunction!(budget_deposit, m)?)?;
    m.add_function(wrap_pyfunction!(budget_withdraw, m)?)?;
    m.add_function(wrap_pyfunction!(admission_admit, m)?)?;
    m.add_function(wrap_pyfunction!(admission_release, m)?)?;
    m.add_function(wrap_pyfunction!(admission_observe, m)?)?;
    m.add_function(wrap_pyfunction!(key_pool_select, m)?)?;
    m.add_function(wrap_pyfunction!(key_pool_record, m)?)?;
    m.add_function(wrap_pyfunction!(key_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(check_idempotency_header, m)?)?;
    m.add_function(wrap_pyfunction!(http_request_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(http_response_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(machine_transcript, m)?)?;
    m.add_function(wrap_pyfunction!(journal_verify, m)?)?;
    m.add_function(wrap_pyfunction!(journal_recover, m)?)?;
    m.add_function(wrap_pyfunction!(journal_append, m)?)?;
    m.add_function(wrap_pyfunction!(journal_classify, m)?)?;
    m.add_function(wrap_pyfunction!(idempotency_claim, m)?)?;
    m.add_function(wrap_pyfunction!(idempotency_complete, m)?)?;
    m.add_function(wrap_pyfunction!(request_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(build_policy, m)?)?;
    m.add_function(wrap_pyfunction!(lift_request, m)?)?;
    m.add_function(wrap_pyfunction!(check_sent_request, m)?)?;
    m.add_function(wrap_pyfunction!(check_price_schedule, m)?)?;
    m.add_function(wrap_pyfunction!(price_cost, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_request, m)?)?;
    m.add_function(wrap_pyfunction!(idempotency_key_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(lab, m)?)?;
    m.add_class::<PyPolicyTemplate>()?;
    m.add_function(wrap_pyfunction!(lower_request, m)?)?;
    m.add_function(wrap_pyfunction!(route_capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(lower_routes, m)?)?;
    m.add_class::<machine::PyMachine>()?;
    Ok(())
}
