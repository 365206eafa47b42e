//! Journals and idempotency records: verify, recover, write, append and
//! classify journal events; claim and complete a scoped key.

use crate::decode::from_str;
use crate::error::Result;
use crate::policy::CompiledPolicy;

use super::{compile_policy, out};

/// A journal (a JSON array of `retryledger.journal_event.v1` documents),
/// its errors under `/events`.
pub(super) fn journal_events(events_json: &str) -> Result<crate::journal::Journal> {
    from_str::<crate::journal::Journal>(events_json).map_err(|e| e.under("/events"))
}

/// `Session.resume_journal`: continue `session` (fresh) from a journal's
/// JSON text, verified against the session's policy.
pub fn session_resume_journal(session: &mut crate::Session, events_json: &str) -> Result<()> {
    let events = journal_events(events_json)?;
    session.resume_journal(&events.0)
}

/// `journal_verify`: a policy and a journal in; what the replay found
/// (`attempts`, `head_sha256`, `last_kind`, `lease_generation`, `next_seq`,
/// `run_id`, `terminal`) out, or the first event the core refuses.
pub fn journal_verify(policy_json: &str, events_json: &str) -> Result<String> {
    journal_verify_compiled(&policy_of(policy_json)?, events_json)
}

/// [`journal_verify`] against a compiled policy (a host that keeps one
/// does not have the policy decoded and validated again for every call).
pub fn journal_verify_compiled(cp: &CompiledPolicy, events_json: &str) -> Result<String> {
    let events = journal_events(events_json)?;
    Ok(out(&crate::journal::verify(cp, &events.0)?.summary()))
}

/// The policy a journal call names, compiled; its errors under `/policy`.
fn policy_of(policy_json: &str) -> Result<CompiledPolicy> {
    compile_policy(policy_json).map_err(|e| e.under("/policy"))
}

/// `journal_recover`: what a new owner does with a journal (and, while an
/// attempt waits for one, the receiver's reconciliation answers so far):
/// `resume`, `reconcile`, `adopt` or `done`.
pub fn journal_recover(
    policy_json: &str,
    events_json: &str,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    journal_recover_compiled(&policy_of(policy_json)?, events_json, reconciliation_json)
}

/// [`journal_recover`] against a compiled policy.
pub fn journal_recover_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let rec = reconciliation_of(reconciliation_json)?;
    Ok(out(&crate::journal::recover(cp, &events.0, rec.as_ref())?))
}

fn reconciliation_of(
    reconciliation_json: Option<&str>,
) -> Result<Option<crate::journal::Reconciliation>> {
    reconciliation_json
        .map(|t| {
            from_str::<crate::journal::Reconciliation>(t).map_err(|e| e.under("/reconciliation"))
        })
        .transpose()
}

/// A journal entry's JSON text, decoded; its errors under `/entry`.
fn entry_of(entry_json: &str) -> Result<crate::journal::Entry> {
    from_str::<crate::journal::Entry>(entry_json).map_err(|e| e.under("/entry"))
}

/// `JournalWriter`: the writer of a journal (JSON text of its events) of
/// `cp`, verified, appending under `lease_generation`.
pub fn journal_writer(
    cp: std::sync::Arc<CompiledPolicy>,
    events_json: &str,
    lease_generation: u64,
) -> Result<crate::journal::Writer> {
    crate::journal::Writer::new(cp, &journal_events(events_json)?.0, lease_generation)
}

/// `JournalWriter.append`: the next event (JSON) built from an entry, the
/// writer advanced by it.
pub fn journal_writer_append(
    writer: &mut crate::journal::Writer,
    entry_json: &str,
) -> Result<String> {
    Ok(out(&writer.append(&entry_of(entry_json)?)?))
}

/// `JournalWriter.recover`: `journal_recover` of the journal written so far.
pub fn journal_writer_recover(
    writer: &crate::journal::Writer,
    reconciliation_json: Option<&str>,
) -> Result<String> {
    Ok(out(&writer.recover(
        reconciliation_of(reconciliation_json)?.as_ref(),
    )?))
}

/// `journal_append`: the next event of a journal, built by the core from an
/// entry (`{"kind": …}` and what only the host knows) under the writer's
/// lease generation, with its `seq` and `prev_sha256`; append it at its seq.
pub fn journal_append(
    policy_json: &str,
    events_json: &str,
    lease_generation: u64,
    entry_json: &str,
) -> Result<String> {
    journal_append_compiled(
        &policy_of(policy_json)?,
        events_json,
        lease_generation,
        entry_json,
    )
}

/// [`journal_append`] against a compiled policy.
pub fn journal_append_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    lease_generation: u64,
    entry_json: &str,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let entry = entry_of(entry_json)?;
    Ok(out(&crate::journal::append(
        cp,
        &events.0,
        lease_generation,
        &entry,
    )?))
}

/// `journal_classify`: an event offered for a journal (a late append of an
/// old owner, a retried write): `append`, `duplicate` or `evidence`
/// (`stale_lease`, `seq_taken`; kept, never a decision).
pub fn journal_classify(policy_json: &str, events_json: &str, event_json: &str) -> Result<String> {
    journal_classify_compiled(&policy_of(policy_json)?, events_json, event_json)
}

/// [`journal_classify`] against a compiled policy.
pub fn journal_classify_compiled(
    cp: &CompiledPolicy,
    events_json: &str,
    event_json: &str,
) -> Result<String> {
    let events = journal_events(events_json)?;
    let event =
        from_str::<crate::journal::JournalEvent>(event_json).map_err(|e| e.under("/event"))?;
    Ok(out(&crate::journal::classify_append(
        cp, &events.0, &event,
    )?))
}

fn retention_of(retention_json: &str) -> Result<crate::idempotency::Retention> {
    let r = from_str::<crate::idempotency::Retention>(retention_json)
        .map_err(|e| e.under("/retention"))?;
    r.check("/retention")?;
    Ok(r)
}

/// `idempotency_claim`: a retention, the record the store holds for the
/// key (or none), the request (`idempotency_key_sha256`, `request_sha256`)
/// and the wall clock in; `proceed` (with the record to write by
/// compare-and-set), `replay`, `poll` or `rejected` out.
pub fn idempotency_claim(
    retention_json: &str,
    record_json: Option<&str>,
    request_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let retention = retention_of(retention_json)?;
    let record = record_json
        .map(|t| {
            from_str::<crate::idempotency::IdempotencyRecord>(t).map_err(|e| e.under("/record"))
        })
        .transpose()?;
    let request = from_str::<crate::idempotency::ClaimRequest>(request_json)
        .map_err(|e| e.under("/request"))?;
    Ok(out(&crate::idempotency::claim(
        &retention,
        record.as_ref(),
        &request,
        now_epoch_ms,
    )?))
}

/// `idempotency_complete`: the claimed record moved to `succeeded` (with
/// the result's digest), `failed_no_effect` or `indeterminate`; the record
/// to write back by compare-and-set.
pub fn idempotency_complete(
    retention_json: &str,
    record_json: &str,
    completion_json: &str,
    now_epoch_ms: u64,
) -> Result<String> {
    let retention = retention_of(retention_json)?;
    let record = from_str::<crate::idempotency::IdempotencyRecord>(record_json)
        .map_err(|e| e.under("/record"))?;
    let completion = from_str::<crate::idempotency::Completion>(completion_json)
        .map_err(|e| e.under("/completion"))?;
    Ok(out(&crate::idempotency::complete(
        &retention,
        &record,
        &completion,
        now_epoch_ms,
    )?))
}
