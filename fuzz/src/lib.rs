//! The checks behind every fuzz target. Each takes arbitrary bytes, runs one
//! decoder or operation of `retryledger_core`, and asserts what must hold for
//! any input: no panic, errors carry a known code and a JSON Pointer, and what
//! decodes re-encodes to its canonical form with the same digest. A failed
//! assertion is a finding, exactly like a crash.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    missing_docs,
    reason = "fuzz checks: a failed assertion is the finding"
)]

use std::borrow::Cow;
use std::sync::OnceLock;

use retryledger_core::api;
use retryledger_core::canonical::{canonical_json, sha256_hex, to_jcs};
use retryledger_core::decode::from_str;
use retryledger_core::limits::{MAX_RETRY_AFTER_BYTES, MAX_SAFE_INTEGER};
use retryledger_core::{
    lab, Attempts, Bundle, Decision, Error, ErrorCode, Outcome, Policy, Receipt, Verdict,
};
use serde_json::Value;

fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

fn reference_policy() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| lab::reference_policy().to_string())
}

/// An error is one of the known codes, with a JSON Pointer when it has a path,
/// and its JSON form (what bindings raise from) is a well-formed object.
pub fn check_error(e: &Error) {
    assert!(ErrorCode::ALL.contains(&e.code));
    if let Some(p) = &e.path {
        assert!(p.is_empty() || p.starts_with('/'), "path {p:?}");
    }
    let v: Value = serde_json::from_str(&api::error_json(e)).expect("error_json is JSON");
    assert_eq!(v["code"], e.code.as_str());
    assert_eq!(v["family"], e.family().as_str());
}

/// An operation's output is its value's RFC 8785 form, byte for byte.
fn assert_jcs(out: &str) {
    let v: Value = serde_json::from_str(out).expect("output is JSON");
    assert_eq!(to_jcs(&v), out, "output is not canonical");
}

/// `a\0b` splits into (a, b); without a NUL byte the reference policy is paired with the input.
fn pair(data: &[u8]) -> (Cow<'_, str>, Cow<'_, str>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (text(&data[..i]), text(&data[i + 1..])),
        None => (Cow::Borrowed(reference_policy()), text(data)),
    }
}

fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn check_decode_policy(data: &[u8]) {
    let t = text(data);
    match from_str::<Policy>(&t) {
        Ok(p) => {
            let canon = canonical_json(&p);
            assert_eq!(from_str::<Policy>(&canon).expect("canonical re-decodes"), p);
            let digest = api::digest(&canon).expect("canonical digests");
            assert_eq!(digest, sha256_hex(canon.as_bytes()));
            assert_eq!(api::digest(&t).expect("decoded input digests"), digest);
            match api::validate_policy(&t) {
                Ok(d) => assert_eq!(d, digest),
                Err(e) => {
                    check_error(&e);
                    assert_eq!(e.family().as_str(), "policy");
                }
            }
        }
        Err(e) => {
            check_error(&e);
            assert_eq!(e.family().as_str(), "decode");
            assert_eq!(api::validate_policy(&t).unwrap_err(), e);
        }
    }
}

pub fn check_decode_attempts(data: &[u8]) {
    let t = text(data);
    match from_str::<Attempts>(&t) {
        Ok(a) => {
            let canon = canonical_json(&a);
            assert_eq!(
                from_str::<Attempts>(&canon).expect("canonical re-decodes"),
                a
            );
            assert_eq!(
                api::digest(&t).expect("digests"),
                sha256_hex(canon.as_bytes())
            );
        }
        Err(e) => {
            check_error(&e);
            assert_eq!(e.family().as_str(), "decode");
        }
    }
}

pub fn check_decode_bundle(data: &[u8]) {
    let t = text(data);
    match from_str::<Bundle>(&t) {
        Ok(b) => {
            let canon = canonical_json(&b);
            assert_eq!(from_str::<Bundle>(&canon).expect("canonical re-decodes"), b);
            assert_eq!(
                api::digest(&t).expect("digests"),
                sha256_hex(canon.as_bytes())
            );
            let receipt_canon = canonical_json(&b.receipt);
            assert_eq!(
                from_str::<Receipt>(&receipt_canon).expect("receipt re-decodes"),
                b.receipt
            );
            check_verify(&t);
        }
        Err(e) => check_error(&e),
    }
}

pub fn check_decode_observation(data: &[u8]) {
    let t = text(data);
    match api::classify_http(&t) {
        Ok(out) => {
            let o: Outcome = from_str(&out).expect("an outcome");
            if let Some(ms) = o.retry_after_ms() {
                assert!(ms <= MAX_SAFE_INTEGER);
            }
            assert_jcs(&out);
        }
        Err(e) => check_error(&e),
    }
}

/// Layout: header selector byte, now (8 bytes LE), cap (8 bytes LE), value.
pub fn check_retry_after(data: &[u8]) {
    if data.len() < 17 {
        return;
    }
    let header = if data[0] % 2 == 0 {
        "retry-after"
    } else {
        "retry-after-ms"
    };
    let now = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let cap = u64::from_le_bytes(data[9..17].try_into().unwrap());
    let value = text(&data[17..]);
    match api::parse_retry_after(header, &value, now, cap) {
        Ok(ms) => {
            assert!(ms <= cap && ms <= MAX_SAFE_INTEGER, "{ms} over cap {cap}");
            assert!(value.len() <= MAX_RETRY_AFTER_BYTES);
        }
        Err(e) => {
            check_error(&e);
            assert_eq!(e.family().as_str(), "http");
        }
    }
}

pub fn check_plan_next(data: &[u8]) {
    let (policy, attempts) = pair(data);
    match api::plan_next(&policy, &attempts) {
        Ok(out) => {
            let d: Decision = from_str(&out).expect("a decision");
            assert_eq!(canonical_json(&d), out);
            assert_jcs(&out);
            if let Decision::Dispatch(d) = d {
                assert!(d.not_before_ms < d.deadline_ms);
                assert!(d.not_before_ms >= d.retry_after_floor_ms);
                assert!(d.ordinal >= 1 && d.route_ordinal >= 1);
            }
            assert_eq!(api::plan_next(&policy, &attempts).unwrap(), out);
        }
        Err(e) => check_error(&e),
    }
}

pub fn check_evaluate(data: &[u8]) {
    let (policy, attempts) = pair(data);
    match api::evaluate(&policy, &attempts) {
        Ok(out) => {
            let r: Receipt = from_str(&out).expect("a receipt");
            assert_eq!(canonical_json(&r), out);
            assert_jcs(&out);
            assert_eq!(api::evaluate(&policy, &attempts).unwrap(), out);
            let compiled = api::compile_policy(&policy).expect("evaluated, so valid");
            let bundle = api::seal_compiled(&compiled, &attempts).expect("seals");
            let verdict: Verdict = from_str(&api::verify(&bundle).expect("verifies"))
                .expect("a verdict");
            match verdict {
                Verdict::Verified {
                    receipt_sha256,
                    terminal,
                    ..
                } => {
                    assert_eq!(receipt_sha256, sha256_hex(out.as_bytes()));
                    assert_eq!(terminal, r.terminal);
                }
                Verdict::Drift { code, .. } => panic!("a sealed run drifts: {code}"),
            }
        }
        Err(e) => check_error(&e),
    }
}

fn check_verify(t: &str) {
    match api::verify(t) {
        Ok(out) => {
            assert_jcs(&out);
            let v: Verdict = from_str(&out).expect("a verdict");
            match v {
                Verdict::Verified { receipt_sha256, .. } => assert!(is_digest(&receipt_sha256)),
                Verdict::Drift { code, path, .. } => {
                    assert!(ErrorCode::ALL.iter().any(|c| c.as_str() == code));
                    assert!(path.starts_with('/'));
                }
            }
            assert_eq!(api::verify(t).unwrap(), out);
        }
        Err(e) => check_error(&e),
    }
}

pub fn check_verify_bundle(data: &[u8]) {
    check_verify(&text(data));
}

pub fn check_digest(data: &[u8]) {
    let t = text(data);
    match api::digest(&t) {
        Ok(d) => {
            assert!(is_digest(&d));
            assert_eq!(api::digest(&t).unwrap(), d);
        }
        Err(e) => check_error(&e),
    }
}

/// A repair chain: a verdict (`verified` or the first `drift` at a link) in
/// canonical form, or a coded error; never a panic.
pub fn check_repair_chain(data: &[u8]) {
    let t = text(data);
    match api::verify_repair_chain(&t) {
        Ok(out) => {
            let v: Value = serde_json::from_str(&out).expect("JSON");
            assert!(matches!(v["kind"].as_str(), Some("verified" | "drift")));
            assert_jcs(&out);
        }
        Err(e) => check_error(&e),
    }
}

/// Facts -> judgement: a known rule, an outcome that decodes, canonical output.
pub fn check_judge(data: &[u8]) {
    let t = text(data);
    match api::judge(&t) {
        Ok(out) => {
            let v: Value = serde_json::from_str(&out).expect("JSON");
            let rule = v["rule"].as_str().expect("a rule");
            assert!(retryledger_core::observe::Rule::NAMES.contains(&rule));
            let _: Outcome = from_str(&v["outcome"].to_string()).expect("an outcome");
            assert_jcs(&out);
        }
        Err(e) => check_error(&e),
    }
}

/// A logical request: its canonical form is a fixed point with the same digest.
pub fn check_request(data: &[u8]) {
    let t = text(data);
    match api::canonical_request(&t) {
        Ok(canonical) => {
            let digest = api::request_sha256(&t).unwrap();
            assert_eq!(sha256_hex(canonical.as_bytes()), digest);
            assert_eq!(api::canonical_request(&canonical).unwrap(), canonical);
            assert_eq!(api::digest(&canonical).unwrap(), digest);
        }
        Err(e) => check_error(&e),
    }
}

/// `request\0spec`: a built policy validates to its own digest.
pub fn check_build_policy(data: &[u8]) {
    let (request, spec) = match data.iter().position(|&b| b == 0) {
        Some(i) => (text(&data[..i]), text(&data[i + 1..])),
        None => return,
    };
    match api::build_policy(&request, &spec) {
        Ok(policy) => {
            assert_jcs(&policy);
            assert_eq!(
                api::validate_policy(&policy).unwrap(),
                sha256_hex(policy.as_bytes())
            );
        }
        Err(e) => check_error(&e),
    }
}

/// `schedule\0release\0usage`: a cost in range, or a coded error.
pub fn check_price_cost(data: &[u8]) {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (Some(schedule), Some(release), Some(usage)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    match api::price_cost(&text(schedule), &text(release), &text(usage)) {
        Ok(cost) => assert!(cost <= MAX_SAFE_INTEGER),
        Err(e) => check_error(&e),
    }
}

/// Layout: family selector byte, status (2 bytes LE, folded into 100..=599),
/// cap (4 bytes LE), then `body\0headers` with one `name: value` per line.
/// A provider-aware reading never fails, never panics, and its hint stays
/// within the cap; the same facts judged give the same outcome (for an
/// error status: a raised error with a 2xx status is never a success).
pub fn check_provider_body(data: &[u8]) {
    use retryledger_core::http::{classify_http, HttpObservation};
    use retryledger_core::observe::{judge, Facts};
    use retryledger_core::provider::ProviderFamily;
    if data.len() < 7 {
        return;
    }
    let family = ProviderFamily::ALL[usize::from(data[0]) % ProviderFamily::ALL.len()];
    let status = 100 + u64::from(u16::from_le_bytes([data[1], data[2]])) % 500;
    let cap = u64::from(u32::from_le_bytes(data[3..7].try_into().unwrap()));
    let rest = text(&data[7..]);
    let (body, head) = rest.split_once('\0').unwrap_or((&rest, ""));
    let headers: Vec<(String, String)> = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .take(64)
        .collect();
    let obs = HttpObservation {
        error_body: Some(body.to_owned()),
        headers: headers.clone(),
        now_unix_ms: 1_764_777_946_000,
        provider_family: Some(family),
        response_bytes_received: false,
        retry_after_cap_ms: cap,
        status: Some(status),
        transport_error: None,
    };
    let o = classify_http(&obs).expect("a status in range is always classified");
    if let Some(ms) = o.retry_after_ms() {
        assert!(ms <= cap, "{ms} over cap {cap}");
    }
    assert_jcs(&canonical_json(&o));
    let mut facts = Facts::raised();
    facts.status = Some(status);
    facts.headers = headers;
    facts.error_body = Some(body.to_owned());
    facts.provider_family = Some(family);
    facts.now_unix_ms = 1_764_777_946_000;
    let j = judge(&facts).expect("judged");
    // A raised error is never a success: only an error status is the same outcome.
    if !(200..=299).contains(&status) {
        assert_eq!(j.outcome.class(), o.class());
        assert_eq!(j.outcome.kind_name(), o.kind_name());
    }
    let text = canonical_json(&j);
    assert_jcs(&text);
    assert_eq!(api::judge(&canonical_json(&facts)).unwrap(), text);
}

/// `events[\0reconciliation[\0offered event]]` against the reference policy:
/// a journal that verifies always has a recovery answer (and one that does
/// not, the same error); an adopted attempt always appends as `observed`;
/// every answer is canonical JSON, every failure a coded error.
pub fn check_journal(data: &[u8]) {
    let mut parts = data.splitn(3, |&b| b == 0);
    let events = text(parts.next().unwrap_or_default());
    let rec = parts.next().map(text);
    let offered = parts.next().map(text);
    let policy = reference_policy();
    let verified = api::journal_verify(policy, &events);
    let recovered = api::journal_recover(policy, &events, None);
    match (&verified, &recovered) {
        (Ok(v), Ok(r)) => {
            assert_jcs(v);
            assert_jcs(r);
        }
        (Err(a), Err(b)) => {
            check_error(a);
            assert_eq!(a.code, b.code, "recovery refuses what verification refuses");
        }
        _ => panic!("verify and recover disagree: {verified:?} / {recovered:?}"),
    }
    if let Some(rec) = rec {
        match api::journal_recover(policy, &events, Some(&rec)) {
            Ok(out) => {
                assert_jcs(&out);
                let answer: Value = serde_json::from_str(&out).expect("json");
                if answer["kind"] == "adopt" {
                    let entry = serde_json::json!({"kind": "observed", "attempt": answer["attempt"]});
                    let generation = serde_json::from_str::<Value>(verified.as_ref().expect("verified"))
                        .expect("json")["lease_generation"]
                        .as_u64()
                        .expect("generation");
                    api::journal_append(policy, &events, generation, &entry.to_string())
                        .expect("an adopted attempt appends");
                }
            }
            Err(e) => check_error(&e),
        }
    }
    if let Some(offered) = offered {
        match api::journal_classify(policy, &events, &offered) {
            Ok(out) => assert_jcs(&out),
            Err(e) => check_error(&e),
        }
    }
}

/// `now (8 bytes, little endian) retention\0record\0request\0completion`
/// (`record` empty: none): a claim that proceeds, asked again at once by the
/// same request, polls; a completion gives a record the claim accepts.
pub fn check_idempotency(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let now = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) & MAX_SAFE_INTEGER;
    let mut parts = data[8..].splitn(4, |&b| b == 0);
    let (Some(retention), Some(record), Some(request)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let completion = parts.next();
    let (retention, request) = (text(retention), text(request));
    let record = (!record.is_empty()).then(|| text(record));
    match api::idempotency_claim(&retention, record.as_deref(), &request, now) {
        Ok(out) => {
            assert_jcs(&out);
            let claim: Value = serde_json::from_str(&out).expect("json");
            if claim["kind"] == "proceed" {
                let written = claim["record"].to_string();
                let again = api::idempotency_claim(&retention, Some(&written), &request, now)
                    .expect("the written record is valid");
                let again: Value = serde_json::from_str(&again).expect("json");
                assert_eq!(again["kind"], "poll", "a claim in progress polls");
            }
        }
        Err(e) => check_error(&e),
    }
    if let (Some(record), Some(completion)) = (record, completion) {
        match api::idempotency_complete(&retention, &record, &text(completion), now) {
            Ok(out) => {
                assert_jcs(&out);
                let answer = api::idempotency_claim(&retention, Some(&out), &request, now);
                if let Err(e) = answer {
                    check_error(&e);
                }
            }
            Err(e) => check_error(&e),
        }
    }
}

/// `admission_observe`: `now` (8 bytes LE, folded to 2^53-1), then
/// `config\0snapshot\0headers` (JSON texts). A response's rate-limit headers
/// never panic and never fail once the inputs decode; the next snapshot is
/// canonical, valid for the config, its bucket times never go back, and a
/// second reading of the same headers at the same time changes nothing more.
pub fn check_admission_observe(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let now = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) & MAX_SAFE_INTEGER;
    let mut parts = data[8..].splitn(3, |&b| b == 0);
    let (Some(config), Some(snapshot), Some(headers)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let (config, snapshot, headers) = (text(config), text(snapshot), text(headers));
    match api::admission_observe(&config, &snapshot, &headers, now) {
        Ok(out) => {
            assert_jcs(&out);
            let v: Value = serde_json::from_str(&out).expect("json");
            let before: Value = serde_json::from_str(&snapshot).expect("it decoded");
            for at in ["requests_at_epoch_ms", "tokens_at_epoch_ms"] {
                assert!(v["snapshot"][at].as_u64() >= before[at].as_u64(), "{at} went back");
            }
            let next = v["snapshot"].to_string();
            let again = api::admission_observe(&config, &next, &headers, now)
                .expect("the next snapshot is valid for the config");
            let again: Value = serde_json::from_str(&again).expect("json");
            assert_eq!(again["snapshot"], v["snapshot"], "the same headers again change nothing");
        }
        Err(e) => check_error(&e),
    }
}
