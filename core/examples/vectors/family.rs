//! A family of vectors: its cases, each computed through `retryledger_core::api`
//! and checked against what it is meant to show, and its file.

use std::path::Path;

use retryledger_core::api;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

/// A named set of pointer edits and the code or terminal it must show.
pub type EditCase = (&'static str, Vec<(&'static str, Value)>, &'static str);
/// The same with owned pointers.
pub type DriftCase = (&'static str, Vec<(String, Value)>, &'static str);

/// One vector.
pub struct Case {
    pub name: String,
    op: &'static str,
    input: Vec<(&'static str, Value)>,
    expect: Value,
}

impl Serialize for Case {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("name", &self.name)?;
        m.serialize_entry("op", self.op)?;
        m.serialize_entry("input", &Ordered(&self.input))?;
        m.serialize_entry("expect", &self.expect)?;
        m.end()
    }
}

struct Ordered<'a>(&'a [(&'static str, Value)]);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

struct FamilyFile<'a> {
    family: &'a str,
    description: &'a str,
    cases: &'a [Case],
}

impl Serialize for FamilyFile<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("schema", "retryledger.vectors.v1")?;
        m.serialize_entry("family", self.family)?;
        m.serialize_entry("description", self.description)?;
        m.serialize_entry("cases", self.cases)?;
        m.end()
    }
}

/// A family of cases under construction.
pub struct Family {
    pub name: &'static str,
    description: &'static str,
    pub covers: &'static str,
    pub cases: Vec<Case>,
}

fn get<'a>(input: &'a [(&'static str, Value)], key: &str) -> &'a Value {
    input
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("input has no `{key}`"))
}

fn text<'a>(input: &'a [(&'static str, Value)], key: &str) -> &'a str {
    get(input, key).as_str().expect("a text input")
}

fn opt_text<'a>(input: &'a [(&'static str, Value)], key: &str) -> Option<&'a str> {
    input
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str().expect("a text input"))
}

fn parsed(s: String) -> Value {
    serde_json::from_str(&s).expect("api output is JSON")
}

/// The expected result of an operation: what the api returns, as data.
fn compute(op: &str, input: &[(&'static str, Value)]) -> Value {
    if op == "drive" {
        let object: serde_json::Map<String, Value> = input
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        return crate::drivers::drive(&Value::Object(object));
    }
    let r: retryledger_core::Result<Value> = match op {
        "validate_policy" => api::validate_policy(text(input, "policy")).map(Value::String),
        "plan_next" => api::plan_next(text(input, "policy"), text(input, "attempts")).map(parsed),
        "evaluate" => api::evaluate(text(input, "policy"), text(input, "attempts")).map(parsed),
        "verify_bundle" => api::verify(text(input, "bundle")).map(parsed),
        "digest" => api::digest(text(input, "document")).map(Value::String),
        "parse_retry_after" => api::parse_retry_after(
            text(input, "header"),
            text(input, "value"),
            get(input, "now_unix_ms").as_u64().expect("now"),
            get(input, "cap_ms").as_u64().expect("cap"),
        )
        .map(Value::from),
        "classify_http" => api::classify_http(text(input, "observation")).map(parsed),
        "judge" => api::judge(text(input, "facts")).map(parsed),
        "next_repair" => api::next_repair(
            text(input, "links"),
            text(input, "request_sha256"),
            text(input, "idempotency_key_sha256"),
            get(input, "started_at_ms").as_u64().expect("started_at_ms"),
        )
        .map(parsed),
        "verify_repair_chain" => api::verify_repair_chain(text(input, "chain")).map(parsed),
        "check_price_schedule" => {
            api::check_price_schedule(text(input, "policy"), text(input, "schedule"))
                .map(Value::String)
        }
        "price_cost" => api::price_cost(
            text(input, "schedule"),
            text(input, "route_release_sha256"),
            text(input, "usage"),
        )
        .map(Value::from),
        "lift_request" => api::lift_request(text(input, "call"), text(input, "params")).map(parsed),
        "build_policy" => {
            api::build_policy(text(input, "request"), text(input, "spec")).map(parsed)
        }
        "bind_policy_template" => api::compile_policy_template(text(input, "spec"))
            .and_then(|tpl| {
                api::bind_policy_template(
                    &tpl,
                    text(input, "request"),
                    text(input, "idempotency_key_sha256"),
                )
            })
            .map(|b| json!({"policy": parsed(b.policy_json), "policy_sha256": b.policy_sha256})),
        "canonical_request" => api::canonical_request(text(input, "request")).map(Value::String),
        "request_sha256" => api::request_sha256(text(input, "request")).map(Value::String),
        "idempotency_key_sha256" => api::idempotency_key_sha256(
            text(input, "key"),
            input
                .iter()
                .find(|(k, _)| *k == "tenant")
                .and_then(|(_, v)| v.as_str()),
            input
                .iter()
                .find(|(k, _)| *k == "operation")
                .and_then(|(_, v)| v.as_str()),
        )
        .map(Value::String),
        "key_pool_select" => api::key_pool_select(
            text(input, "config"),
            opt_text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
            opt_text(input, "affinity"),
        )
        .map(parsed),
        "key_pool_record" => api::key_pool_record(
            text(input, "config"),
            opt_text(input, "snapshot"),
            text(input, "key_sha256"),
            text(input, "outcome"),
            input
                .iter()
                .find(|(k, _)| *k == "status")
                .and_then(|(_, v)| v.as_u64()),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "key_sha256" => api::key_sha256(text(input, "secret")).map(Value::String),
        "check_idempotency_header" => {
            api::check_idempotency_header(text(input, "raw")).map(|()| Value::Null)
        }
        "http_request_sha256" => Ok(Value::String(api::http_request_sha256(
            text(input, "method"),
            text(input, "target"),
            text(input, "body").as_bytes(),
        ))),
        "http_response_sha256" => api::http_response_sha256(
            get(input, "status").as_u64().expect("status"),
            text(input, "headers"),
            text(input, "body").as_bytes(),
        )
        .map(Value::String),
        "breaker_admit" => api::breaker_admit(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "breaker_record" => api::breaker_record(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "probe").as_bool().expect("probe"),
            text(input, "outcome"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "admission_admit" => api::admission_admit(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
            get(input, "queued_since_epoch_ms").as_u64().expect("since"),
            get(input, "tokens").as_u64().expect("tokens"),
            opt_text(input, "tenant"),
        )
        .map(parsed),
        "admission_release" => api::admission_release(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
            get(input, "reserved").as_u64().expect("reserved"),
            input
                .iter()
                .find(|(k, _)| *k == "used")
                .and_then(|(_, v)| v.as_u64()),
        )
        .map(parsed),
        "admission_observe" => api::admission_observe(
            text(input, "config"),
            text(input, "snapshot"),
            text(input, "headers"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "budget_deposit" => api::budget_deposit(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "budget_withdraw" => api::budget_withdraw(
            text(input, "config"),
            text(input, "snapshot"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "journal_verify" => {
            api::journal_verify(text(input, "policy"), text(input, "events")).map(parsed)
        }
        "journal_recover" => api::journal_recover(
            text(input, "policy"),
            text(input, "events"),
            opt_text(input, "reconciliation"),
        )
        .map(parsed),
        "journal_append" => api::journal_append(
            text(input, "policy"),
            text(input, "events"),
            get(input, "lease_generation").as_u64().expect("generation"),
            text(input, "entry"),
        )
        .map(parsed),
        "journal_classify" => api::journal_classify(
            text(input, "policy"),
            text(input, "events"),
            text(input, "event"),
        )
        .map(parsed),
        "idempotency_claim" => api::idempotency_claim(
            text(input, "retention"),
            opt_text(input, "record"),
            text(input, "request"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "idempotency_complete" => api::idempotency_complete(
            text(input, "retention"),
            text(input, "record"),
            text(input, "completion"),
            get(input, "now_epoch_ms").as_u64().expect("now"),
        )
        .map(parsed),
        "fleet_session" => retryledger_core::lab::fleet_session(
            text(input, "policy"),
            text(input, "store"),
            text(input, "script"),
        ),
        "priced_session" => retryledger_core::lab::priced_session(
            text(input, "policy"),
            text(input, "schedule"),
            text(input, "script"),
        ),
        "job_session" => {
            retryledger_core::lab::job_session(text(input, "policy"), text(input, "script"))
        }
        "stream_session" => {
            retryledger_core::lab::stream_session(text(input, "policy"), text(input, "script"))
        }
        "machine" => api::machine_transcript(
            text(input, "policy"),
            text(input, "options"),
            opt_text(input, "journal"),
            text(input, "events"),
        )
        .map(parsed),
        "hedge_session" => {
            retryledger_core::hedge::script(text(input, "policy"), text(input, "script"))
        }
        "lower_request" => api::lower_request(
            text(input, "request"),
            text(input, "release"),
            text(input, "options"),
        )
        .map(parsed),
        "route_capabilities" => {
            api::route_capabilities(text(input, "request"), text(input, "spec")).map(parsed)
        }
        other => panic!("unknown op {other}"),
    };
    match r {
        Ok(v) => json!({ "ok": v }),
        Err(e) => {
            let mut err = serde_json::Map::new();
            err.insert("code".into(), json!(e.code.as_str()));
            if let Some(p) = e.path {
                err.insert("path".into(), json!(p));
            }
            json!({ "error": err })
        }
    }
}

impl Family {
    pub fn new(name: &'static str, description: &'static str, covers: &'static str) -> Self {
        Self {
            name,
            description,
            covers,
            cases: Vec::new(),
        }
    }

    /// Add a case; `want` must occur in the computed expectation (as a JSON
    /// string, or `ok` / `error` for the outcome kind).
    pub fn add(
        &mut self,
        name: &str,
        op: &'static str,
        input: Vec<(&'static str, Value)>,
        want: &str,
    ) {
        let expect = compute(op, &input);
        let shown = expect.to_string();
        let matches = match want {
            "ok" => expect.get("ok").is_some(),
            "error" => expect.get("error").is_some(),
            // A `key":value` fragment is looked for as it stands.
            w if w.contains("\":") => shown.contains(&format!("\"{w}")),
            w => shown.contains(&format!("\"{w}\"")) || shown.contains(&format!(":{w}")),
        };
        assert!(
            matches,
            "{}/{name}: expected to show `{want}`, computed {shown:.300}",
            self.name
        );
        self.cases.push(Case {
            name: name.to_owned(),
            op,
            input,
            expect,
        });
    }

    pub fn policy(&mut self, name: &str, policy: &str, want: &str) {
        self.add(
            name,
            "validate_policy",
            vec![("policy", json!(policy))],
            want,
        );
    }

    pub fn plan(&mut self, name: &str, policy: &str, attempts: &str, want: &str) {
        self.add(
            name,
            "plan_next",
            vec![("policy", json!(policy)), ("attempts", json!(attempts))],
            want,
        );
    }

    pub fn eval(&mut self, name: &str, policy: &str, attempts: &str, want: &str) {
        self.add(
            name,
            "evaluate",
            vec![("policy", json!(policy)), ("attempts", json!(attempts))],
            want,
        );
    }

    pub fn verify(&mut self, name: &str, bundle: &str, want: &str) {
        self.add(name, "verify_bundle", vec![("bundle", json!(bundle))], want);
    }

    pub fn digest(&mut self, name: &str, document: &str, want: &str) {
        self.add(name, "digest", vec![("document", json!(document))], want);
    }

    pub fn retry_after(
        &mut self,
        name: &str,
        header: &str,
        value: &str,
        now: u64,
        cap: u64,
        want: &str,
    ) {
        self.add(
            name,
            "parse_retry_after",
            vec![
                ("header", json!(header)),
                ("value", json!(value)),
                ("now_unix_ms", json!(now)),
                ("cap_ms", json!(cap)),
            ],
            want,
        );
    }

    pub fn classify(&mut self, name: &str, observation: &str, want: &str) {
        self.add(
            name,
            "classify_http",
            vec![("observation", json!(observation))],
            want,
        );
    }
}

/// Write the family to `<dir>/<name>.json`; the number of bytes written.
pub fn write_family(dir: &Path, fam: &Family) -> std::io::Result<usize> {
    let file = FamilyFile {
        family: fam.name,
        description: fam.description,
        cases: &fam.cases,
    };
    let mut text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(dir.join(format!("{}.json", fam.name)), text.as_bytes())?;
    Ok(text.len())
}
