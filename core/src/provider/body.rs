//! Reading a provider's error body: its code, status and detail hints,
//! and the table row they select.

use serde_json::Value;

use super::{Note, ProviderFamily, Quota, Row, F, MAX_BODY_DETAILS, MAX_ERROR_BODY_BYTES, TABLE};

/// The fields of an error body the classifier reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Body {
    pub(super) error_type: Option<String>,
    pub(super) error_code: Option<String>,
    pub(super) error_status: Option<String>,
    /// `retryDelay` of the first RetryInfo detail, as written.
    pub(super) retry_delay: Option<String>,
    /// Whether a RetryInfo detail carried a `retryDelay` that is not a string.
    pub(super) retry_delay_not_text: bool,
    pub(super) per_day: bool,
}

const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
const QUOTA_FAILURE: &str = "type.googleapis.com/google.rpc.QuotaFailure";

pub(super) fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::String(s)) => Some(s.chars().take(crate::limits::MAX_ID_BYTES).collect()),
        _ => None,
    }
}

pub(super) fn read_body(body: &str, notes: &mut Vec<Note>) -> Option<Body> {
    if body.len() > MAX_ERROR_BODY_BYTES {
        notes.push(Note::BodyOversize);
        return None;
    }
    let value = match crate::parse::parse_any(body) {
        Ok(v) => v,
        Err(e) => {
            notes.push(if e.code == crate::error::ErrorCode::NestingTooDeep {
                Note::BodyTooDeep
            } else {
                Note::BodyMalformed
            });
            return None;
        }
    };
    let Value::Object(top) = &value else {
        notes.push(Note::BodyMalformed);
        return None;
    };
    let error = match top.get("error") {
        Some(Value::Object(e)) => e,
        _ => top,
    };
    let mut out = Body {
        error_type: text(error.get("type")),
        error_code: text(error.get("code")),
        error_status: text(error.get("status")),
        ..Body::default()
    };
    let details = match error.get("details") {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    for detail in details.iter().take(MAX_BODY_DETAILS) {
        let Value::Object(d) = detail else { continue };
        match d.get("@type").and_then(Value::as_str) {
            Some(RETRY_INFO) if out.retry_delay.is_none() && !out.retry_delay_not_text => {
                match d.get("retryDelay") {
                    Some(Value::String(s)) => out.retry_delay = Some(s.clone()),
                    Some(_) => out.retry_delay_not_text = true,
                    None => {}
                }
            }
            Some(QUOTA_FAILURE) => {
                let violations = match d.get("violations") {
                    Some(Value::Array(items)) => items.as_slice(),
                    _ => &[],
                };
                for v in violations.iter().take(MAX_BODY_DETAILS) {
                    if let Some(id) = v.get("quotaId").and_then(Value::as_str) {
                        if id.contains("PerDay") {
                            out.per_day = true;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Some(out)
}

fn code_of(family: ProviderFamily, body: &Body) -> Option<&str> {
    match family {
        F::Generic => None,
        F::Openai | F::AzureOpenai => body.error_code.as_deref().or(body.error_type.as_deref()),
        F::Anthropic => body.error_type.as_deref(),
        F::Google => body.error_status.as_deref(),
    }
}

/// The row for a family, status and body, if any.
pub(super) fn lookup(family: ProviderFamily, status: u64, body: &Body) -> Option<&'static Row> {
    let family = match family {
        F::AzureOpenai => F::Openai,
        f => f,
    };
    let code = code_of(family, body)?;
    TABLE.iter().find(|r| {
        r.family == family
            && r.status == status
            && r.code == code
            && (r.quota == Quota::Any || body.per_day)
    })
}
