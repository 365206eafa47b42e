//! The JSON boundary: every public operation taking and returning JSON text.
//!
//! Bindings (WebAssembly, Python) call these and nothing else, so each stays a
//! thin layer of glue and every language decodes with the same strict rules
//! and reports the same codes. Outputs are compact JSON in canonical order.

use crate::canonical::{canonical_json, Encode, ObjectWriter, Sink};
use crate::error::Error;

mod fleet;
mod journal;
mod machine;
mod policy;
mod receiver;
mod requests;
pub use fleet::{
    admission_admit, admission_observe, admission_release, breaker_admit, breaker_record,
    budget_deposit, budget_withdraw, key_pool_record, key_pool_select, key_sha256,
};
pub use journal::{
    idempotency_claim, idempotency_complete, journal_append, journal_append_compiled,
    journal_classify, journal_classify_compiled, journal_recover, journal_recover_compiled,
    journal_verify, journal_verify_compiled, journal_writer, journal_writer_append,
    journal_writer_recover, session_resume_journal,
};
pub use machine::{machine_transcript, LiveMachine};
pub use policy::{
    bind_policy_template, bind_policy_template_compiled, bind_policy_template_request,
    build_policy, check_price_schedule, compile_policy, compile_policy_template, decode_attempts,
    digest, evaluate, evaluate_compiled, next_repair, plan_next, plan_next_compiled, price_cost,
    repair_step, seal_compiled, validate_policy, verify, verify_repair_chain,
};
pub use receiver::{check_idempotency_header, http_request_sha256, http_response_sha256};
pub use requests::{
    canonical_request, check_sent_request, classify_http, idempotency_key_sha256, judge,
    lift_request, lower_request, lower_routes, parse_retry_after, request_sha256,
    route_capabilities,
};

/// A document's or answer's canonical JSON (RFC 8785).
fn out<T: Encode>(value: &T) -> String {
    canonical_json(value)
}

/// An error as the JSON object bindings raise from: `code`, `family`,
/// `message`, and `path`/`attempt_index` when known; `more_errors`, the
/// further errors a decoder found in the same pass (each of the same shape),
/// when there are any.
pub fn error_json(e: &Error) -> String {
    canonical_json(&ErrorDoc(e))
}

struct ErrorDoc<'a>(&'a Error);

impl Encode for ErrorDoc<'_> {
    fn encode(&self, sink: &mut dyn Sink) {
        let e = self.0;
        let index = e.attempt_index.and_then(|i| u64::try_from(i).ok());
        let mut o = ObjectWriter::new(sink);
        o.opt_u64("attempt_index", index)
            .str("code", e.code.as_str())
            .str("family", e.family().as_str())
            .str("message", &e.message);
        if !e.more.is_empty() {
            let more: Vec<ErrorDoc<'_>> = e.more.iter().map(ErrorDoc).collect();
            o.list("more_errors", &more);
        }
        if let Some(p) = &e.path {
            o.str("path", p);
        }
        o.end();
    }
}

/// The lab report (canonical JSON), its summary table and its case table.
#[cfg(feature = "lab")]
pub fn lab() -> crate::error::Result<(String, String, String)> {
    let report = crate::lab::run()?;
    let (text, _) = crate::lab::report_bytes(&report);
    Ok((
        text,
        crate::lab::summary(&report),
        crate::lab::case_table(&report),
    ))
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::canonical::to_jcs;
    use crate::decode::{from_str, parse_strict};
    use crate::error::ErrorCode;
    use crate::evaluate::Decision;
    use crate::receipt::Verdict;

    #[test]
    fn answers_are_canonical_and_decode_back() {
        let bundle = crate::lab::reference_bundle().unwrap();
        let policy = canonical_json(&bundle.policy);
        let mut attempts = bundle.attempts.clone();
        for n in 0..=attempts.attempts.len() {
            attempts.attempts.truncate(n);
            let text = plan_next(&policy, &canonical_json(&attempts)).unwrap();
            let value = parse_strict(&text).unwrap();
            assert_eq!(to_jcs(&value), text);
            let d: Decision = from_str(&text).unwrap();
            assert_eq!(canonical_json(&d), text);
        }
        let verdict = verify(&canonical_json(&bundle)).unwrap();
        let v: Verdict = from_str(&verdict).unwrap();
        assert!(matches!(v, Verdict::Verified { .. }));
        assert_eq!(canonical_json(&v), verdict);
        let mut drifted = bundle;
        drifted.receipt.total_cost += 1;
        let verdict = verify(&canonical_json(&drifted)).unwrap();
        let v: Verdict = from_str(&verdict).unwrap();
        assert!(matches!(v, Verdict::Drift { ref path, .. } if path == "/receipt/total_cost"));
        assert_eq!(canonical_json(&v), verdict);
        assert_eq!(to_jcs(&parse_strict(&verdict).unwrap()), verdict);
    }

    #[test]
    fn tagged_documents_are_objects_only() {
        // serde's internally tagged enums also took `["retryable", "rate_limited"]`.
        use crate::outcome::Outcome;
        use crate::policy::Jitter;
        for text in [r#"["success"]"#, r#"["retryable","rate_limited"]"#] {
            let e = from_str::<Outcome>(text).unwrap_err();
            assert_eq!(
                (e.code, e.path.as_deref()),
                (ErrorCode::InvalidType, Some(""))
            );
        }
        let e = from_str::<Jitter>(r#"["full","s",1]"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidType);
        let e = from_str::<Outcome>(r#"{"class":5}"#).unwrap_err();
        assert_eq!(
            (e.code, e.path.as_deref()),
            (ErrorCode::InvalidType, Some("/class"))
        );
    }

    #[test]
    fn requests_digest_the_same_with_or_without_floats() {
        let ints = r#"{"schema":"retryledger.request.v1","operation":"chat","input":[1,2]}"#;
        let floats =
            r#"{"schema":"retryledger.request.v1","operation":"chat","input":[1.0,2e0],"seed":0}"#;
        assert_eq!(digest(ints).unwrap(), request_sha256(ints).unwrap());
        assert_eq!(digest(floats).unwrap(), request_sha256(floats).unwrap());
        // A float anywhere else keeps the strict reader's error.
        let e = digest(r#"{"schema":"retryledger.policy.v1","x":1.5}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::FloatValue);
    }

    #[test]
    fn error_json_is_canonical() {
        let e = Error::attempt(ErrorCode::EarlyStart, 2, "started_at_ms", "early");
        assert_eq!(
            error_json(&e),
            r#"{"attempt_index":2,"code":"early_start","family":"drift","message":"early","path":"/attempts/2/started_at_ms"}"#
        );
    }
}
