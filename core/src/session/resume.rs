//! Resuming a session from a verified journal.

use crate::error::{Error, ErrorCode, Result};

use super::{Notes, Session};

impl Session {
    /// Continue the run a verified journal holds: its attempts (reconciled
    /// ones included), its cancellation and its decisions, replayed by
    /// [`crate::journal::verify`], so the host observes the next attempt
    /// through this session like any other and seals from it. Only a fresh
    /// session resumes (a price schedule may be set first). A journal is
    /// kept for runs without a fleet section (a session's host admits
    /// nothing on resume: `admission_unexpected`; the run machine,
    /// [`crate::machine`], resumes a fleet run and admits its next attempt
    /// again) and without a stream contract (its event log is not in the
    /// journal: `invalid_stream_contract`).
    pub fn resume_journal(&mut self, events: &[crate::journal::JournalEvent]) -> Result<()> {
        self.check_resumable(false)?;
        let replayed = crate::journal::verify(&self.policy, events)?;
        self.continue_replay(replayed);
        Ok(())
    }

    /// [`Session::resume_journal`] from the replay a journal's writer keeps
    /// (made under this session's policy: [`crate::journal::Writer::resume`]).
    pub(crate) fn resume_replayed(&mut self, replayed: crate::machine::replay::Log) -> Result<()> {
        self.check_resumable(false)?;
        self.continue_replay(replayed);
        Ok(())
    }

    /// [`Session::resume_replayed`] for the run machine, which admits a
    /// resumed run's next attempt under its fleet section.
    pub(crate) fn resume_admitting(&mut self, replayed: crate::machine::replay::Log) -> Result<()> {
        self.check_resumable(true)?;
        let log = match &self.policy.policy.stream {
            Some(contract) => Some(crate::stream::log_of(contract.mode, &replayed)?),
            None => None,
        };
        // The snapshots the journaled admissions read: the bundle of the
        // continued run carries them with its attempts.
        self.snapshots = replayed.snapshots().clone();
        self.continue_replay(replayed);
        if let Some(log) = log {
            self.log = log;
        }
        Ok(())
    }

    /// Only a fresh session of a policy a journal can hold resumes one (a
    /// fleet section only when the resumed run admits again).
    fn check_resumable(&self, admits: bool) -> Result<()> {
        if !self.attempts.attempts.is_empty()
            || self.attempts.cancelled_at_ms.is_some()
            || self.pending.is_some()
        {
            return Err(Error::at(
                ErrorCode::InvalidValue,
                "/events",
                "only a session with no attempt yet resumes a journal",
            ));
        }
        if self.policy.policy.fleet.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::AdmissionUnexpected,
                "/fleet",
                "a journal does not hold the fleet's snapshots: a session resumes no fleet run (the run machine does, admitting again)",
            ));
        }
        if self.policy.policy.stream.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::InvalidStreamContract,
                "/stream",
                "a session does not rebuild a stream's event log from a journal: the run machine resumes a streamed run",
            ));
        }
        if self.policy.policy.async_job.is_some() && !admits {
            return Err(Error::at(
                ErrorCode::InvalidAsyncJob,
                "/async_job",
                "a session does not resume a job from a journal: the run machine resumes a journaled job",
            ));
        }
        Ok(())
    }

    fn continue_replay(&mut self, replayed: crate::machine::replay::Log) {
        let (run, attempts) = replayed.into_run();
        self.run = run;
        self.attempts = attempts;
        self.notes = Notes::default();
    }
}
