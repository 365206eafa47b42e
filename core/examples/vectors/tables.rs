//! `tables.json`: the core's own tables (error codes and families, terminals,
//! outcome kinds, judging rules, the error type and code tables, document
//! schemas), from which the TypeScript and Python packages generate their
//! types and error maps, so a new code cannot be missing in one language.

use retryledger_core::attempt::AttemptsSchema;
use retryledger_core::canonical::to_value;
use retryledger_core::error::ErrorCode;
use retryledger_core::evaluate::Terminal;
use retryledger_core::observe::{Meaning, Rule, Signal, ERROR_CODES, ERROR_TYPES, READ_HEADERS};
use retryledger_core::outcome::{
    HintSource, IndeterminateKind, NonRetryableKind, OutcomeClass, RetryableKind,
};
use retryledger_core::policy::PolicySchema;
use retryledger_core::provider::{self, Kind, Note, ProviderFamily, Quota};
use retryledger_core::receipt::{BundleSchema, ReceiptSchema};
use serde_json::{json, Value};

fn meaning(m: &Meaning) -> Value {
    match m {
        Meaning::Outcome(o) => json!({ "outcome": to_value(o) }),
        Meaning::Signal(s) => json!({ "signal": s.as_str() }),
    }
}

fn table(t: &[(&str, Meaning)]) -> Value {
    t.iter()
        .map(|(name, m)| json!({"name": name, "meaning": meaning(m)}))
        .collect()
}

/// The tables document.
pub fn tables() -> Value {
    let mut families: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.family().as_str()).collect();
    families.dedup();
    json!({
        "schema": "retryledger.tables.v1",
        "description": "The core's tables, generated: wasm/ts/tables.ts and python/retryledger/_tables.py are generated from this file and checked in CI.",
        "error_codes": ErrorCode::ALL.iter().map(|c| json!({"code": c.as_str(), "family": c.family().as_str()})).collect::<Vec<_>>(),
        "error_families": families,
        "terminals": Terminal::NAMES,
        "outcome_classes": OutcomeClass::NAMES,
        "outcome_kinds": {
            "retryable": RetryableKind::NAMES,
            "non_retryable": NonRetryableKind::NAMES,
            "indeterminate": IndeterminateKind::NAMES,
        },
        "rules": Rule::NAMES,
        "signals": Signal::NAMES,
        "read_headers": READ_HEADERS,
        "fact_limits": {
            "max_error_names": retryledger_core::limits::MAX_ERROR_NAMES,
            "max_error_name_bytes": retryledger_core::limits::MAX_ERROR_NAME_BYTES,
            "max_error_body_bytes": provider::MAX_ERROR_BODY_BYTES,
        },
        "provider_families": ProviderFamily::NAMES,
        "hint_sources": HintSource::NAMES,
        "notes": Note::NAMES,
        "provider_table": provider::TABLE.iter().map(|r| {
            let (class, kind) = match r.kind {
                Kind::Retryable(k) => ("retryable", k.as_str()),
                Kind::NonRetryable(k) => ("non_retryable", k.as_str()),
            };
            let mut row = json!({"family": r.family.as_str(), "status": r.status, "code": r.code, "class": class, "kind": kind});
            if r.quota == Quota::PerDay {
                row["quota"] = json!("per_day");
            }
            row
        }).collect::<Vec<_>>(),
        "observed_error_types": table(ERROR_TYPES),
        "observed_error_codes": table(ERROR_CODES),
        "schemas": [PolicySchema::NAME, AttemptsSchema::NAME, ReceiptSchema::NAME, BundleSchema::NAME],
    })
}

/// Write `<dir>/tables.json`; the number of bytes written.
pub fn write(dir: &std::path::Path) -> std::io::Result<usize> {
    let mut text = serde_json::to_string_pretty(&tables()).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(dir.join("tables.json"), text.as_bytes())?;
    Ok(text.len())
}
