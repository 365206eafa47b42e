//! The stream layer of the run machine: what a streamed attempt leaves in
//! the journal so that a resumed run rebuilds the consumer's event log.
//!
//! An observed streamed attempt is journaled with the SHA-256 of each delta
//! it received (`delta_digests` of its `observed` event, omitted when it
//! received none); they hash to its stream record's `deltas_sha256`, which
//! the replay checks. On resume the session rebuilds the log from them and
//! from the actions the replay took ([`crate::stream`]).
//!
//! An attempt cut by a crash has no observation: it is reconciled with the
//! receiver like any other. The journal holds none of its events, so the
//! attempt is adopted with an empty stream record: `failed_no_effect` lets
//! the plan send again; a `succeeded` answer is read as
//! `succeeded_stream_lost` (the run cannot commit output it never recorded,
//! and never sends it again: `stop_indeterminate`); `unknown` stays
//! indeterminate. A run therefore never commits twice.

use super::Observation;
use crate::ids::Sha256Hex;
use crate::policy::CompiledPolicy;

/// The digests of a streamed attempt's deltas, in order (none without a
/// stream contract, where deltas are refused anyway).
pub(super) fn digests(cp: &CompiledPolicy, obs: &Observation) -> Vec<Sha256Hex> {
    if cp.policy.stream.is_none() {
        return Vec::new();
    }
    obs.deltas
        .iter()
        .map(|d| {
            Sha256Hex::computed(crate::canonical::hex(&crate::stream::delta_digest(
                d.as_bytes(),
            )))
        })
        .collect()
}
