//! What a host driver offers a run: `CompiledPolicy::require_fleet` and
//! `require_driver`, the refusals both languages' drivers take from the core.

#![cfg(feature = "lab")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "tests fail loudly"
)]

use retryledger_core::decode::from_value;
use retryledger_core::error::ErrorCode;
use retryledger_core::host::{Driver, DRIVER_RULES};
use retryledger_core::{compile, lab, CompiledPolicy};
use serde_json::{json, Value};

fn policy_with(edit: impl FnOnce(&mut Value)) -> CompiledPolicy {
    let mut doc = lab::reference_policy();
    edit(&mut doc);
    compile(from_value(doc).unwrap()).unwrap()
}

fn fleet(doc: &mut Value) {
    doc["fleet"] = json!({
        "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000},
        "on_store_unavailable": "fail_closed"
    });
}

#[test]
fn a_fleet_section_needs_a_fleet_and_a_fleet_needs_a_section() {
    let plain = policy_with(|_| {});
    assert!(plain.require_fleet(false).is_ok());
    let e = plain
        .require_fleet(true)
        .expect_err("a fleet without a section is refused");
    assert_eq!(e.code, ErrorCode::AdmissionUnexpected);
    assert_eq!(e.path.as_deref(), Some("/fleet"));

    let fleeted = policy_with(fleet);
    assert!(fleeted.require_fleet(true).is_ok());
    let e = fleeted
        .require_fleet(false)
        .expect_err("a section without a fleet is refused");
    assert_eq!(e.code, ErrorCode::AdmissionMissing);
    assert_eq!(e.path.as_deref(), Some("/fleet"));
}

#[test]
fn the_workflow_driver_refuses_what_its_activities_cannot_carry() {
    assert!(policy_with(|_| {}).require_driver(Driver::Workflow).is_ok());
    let e = policy_with(fleet)
        .require_driver(Driver::Workflow)
        .expect_err("fleet");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::AdmissionMissing, Some("/fleet"))
    );
    assert!(e.message.contains("no fleet store"), "{}", e.message);
    let e =
        policy_with(|d| d["stream"] = json!({"max_response_bytes": 1_000_000, "mode": "buffer"}))
            .require_driver(Driver::Workflow)
            .expect_err("stream");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::StreamRecordMissing, Some("/stream"))
    );
    let e = policy_with(|d| {
        d["async_job"] = json!({"max_polls": 3, "poll_base_ms": 100, "poll_max_ms": 1000});
    })
    .require_driver(Driver::Workflow)
    .expect_err("async_job");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::InvalidAsyncJob, Some("/async_job"))
    );
}

#[test]
fn the_job_and_stream_drivers_need_their_section() {
    let plain = policy_with(|_| {});
    let e = plain.require_driver(Driver::Job).expect_err("no async_job");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::InvalidAsyncJob, Some("/async_job"))
    );
    let e = plain.require_driver(Driver::Stream).expect_err("no stream");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (ErrorCode::InvalidStreamContract, Some("/stream"))
    );
    let job = policy_with(|d| {
        d["async_job"] = json!({"max_polls": 3, "poll_base_ms": 100, "poll_max_ms": 1000});
    });
    assert!(job.require_driver(Driver::Job).is_ok());
    let streamed =
        policy_with(|d| d["stream"] = json!({"max_response_bytes": 1_000_000, "mode": "buffer"}));
    assert!(streamed.require_driver(Driver::Stream).is_ok());
}

#[test]
fn a_job_that_plans_its_cancel_needs_a_cancel_call() {
    let job = |cancel: bool| {
        policy_with(|d| {
            d["async_job"] = json!({"max_polls": 3, "poll_base_ms": 100, "poll_max_ms": 1000});
            if cancel {
                d["async_job"]["cancel_left_running"] = json!(true);
            }
        })
    };
    assert!(job(false).require_job_calls(false).is_ok());
    assert!(job(true).require_job_calls(true).is_ok());
    let e = job(true)
        .require_job_calls(false)
        .expect_err("no cancel call");
    assert_eq!(
        (e.code, e.path.as_deref()),
        (
            ErrorCode::InvalidAsyncJob,
            Some("/async_job/cancel_left_running")
        )
    );
}

#[test]
fn the_framework_models_refuse_the_stream_modes_they_cannot_carry() {
    let mode = |m: &str| {
        policy_with(|d| d["stream"] = json!({"max_response_bytes": 1_000_000, "mode": m}))
    };
    for (driver, refused) in [
        (Driver::AiSdk, &["tentative", "continuation"][..]),
        (Driver::LangChain, &["tentative", "continuation"][..]),
        (Driver::PydanticAi, &["continuation"][..]),
    ] {
        assert!(
            policy_with(|_| {}).require_driver(driver).is_ok(),
            "no stream section"
        );
        for m in ["buffer", "tentative", "continuation", "restart"] {
            let got = mode(m).require_driver(driver);
            if refused.contains(&m) {
                let e = got.expect_err("refused mode");
                assert_eq!(
                    (e.code, e.path.as_deref()),
                    (ErrorCode::InvalidStreamContract, Some("/stream/mode"))
                );
                assert!(e.message.contains(&format!("`{m}`")), "{}", e.message);
            } else {
                assert!(got.is_ok(), "{} takes {m}", driver.as_str());
            }
        }
    }
}

#[test]
fn every_rule_is_printed_in_the_composition_doc() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/COMPOSITION.md"
    ))
    .expect("docs/COMPOSITION.md");
    for r in DRIVER_RULES {
        let row = format!(
            "| {} | {} | `{}` | {} |",
            r.driver.as_str(),
            r.subject(),
            r.code.as_str(),
            r.reason
        );
        assert!(
            doc.contains(&row),
            "docs/COMPOSITION.md lacks the row {row}"
        );
    }
    for name in [
        "workflow",
        "job",
        "stream",
        "ai_sdk",
        "langchain",
        "pydantic_ai",
    ] {
        assert_eq!(Driver::parse(name).expect("known").as_str(), name);
    }
    assert_eq!(
        Driver::parse("celery").expect_err("unknown").code,
        ErrorCode::InvalidValue
    );
}
