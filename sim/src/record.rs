//! What one strategy's run leaves behind: load per time bucket and one line
//! per logical request, from which [`crate::figures`] computes the figures.

use crate::scenario::Scenario;

/// The raw record of one run.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// Width of a bucket, ms.
    pub bucket_ms: u64,
    /// The primary's first failure window, if any.
    pub window: Option<(u64, u64)>,
    /// Physical attempts started per bucket, every route.
    pub offered: Vec<u64>,
    /// Physical attempts started per bucket on each route.
    pub offered_by_route: Vec<Vec<u64>>,
    /// Logical requests admitted per bucket.
    pub admitted: Vec<u64>,
    /// Logical requests that succeeded, per bucket of their end.
    pub succeeded: Vec<u64>,
    /// Time from admission to the final answer of every logical request, ms.
    pub latencies: Vec<u64>,
    /// Logical requests ended.
    pub requests: u64,
    /// Of them, successful.
    pub successes: u64,
    /// Of them, answered at or after their deadline.
    pub late: u64,
    /// Physical attempts of every logical request.
    pub attempts: u64,
    /// Cost of every attempt.
    pub cost: u64,
    /// Logical requests admitted inside the failure window.
    pub window_requests: u64,
    /// Their physical attempts.
    pub window_attempts: u64,
    /// retryledger terminals by name, in first-seen order.
    pub terminals: Vec<(&'static str, u64)>,
}

fn bump(v: &mut Vec<u64>, i: usize, by: u64) {
    if v.len() <= i {
        v.resize(i.saturating_add(1), 0);
    }
    if let Some(x) = v.get_mut(i) {
        *x = x.saturating_add(by);
    }
}

impl Recorder {
    /// An empty record for the scenario; `expected` logical requests.
    pub fn new(s: &Scenario, expected: u64) -> Self {
        let buckets = usize::try_from(s.duration_ms.checked_div(s.bucket_ms).unwrap_or(0))
            .unwrap_or(0)
            .saturating_add(1);
        Self {
            bucket_ms: s.bucket_ms.max(1),
            window: s.failure_window(),
            offered: vec![0; buckets],
            offered_by_route: vec![vec![0; buckets]; s.routes.len()],
            admitted: vec![0; buckets],
            succeeded: vec![0; buckets],
            latencies: Vec::with_capacity(usize::try_from(expected).unwrap_or(0)),
            ..Self::default()
        }
    }

    fn bucket(&self, t: u64) -> usize {
        usize::try_from(t.checked_div(self.bucket_ms).unwrap_or(0)).unwrap_or(usize::MAX)
    }

    /// A logical request was admitted at `t`.
    pub fn admitted(&mut self, t: u64) {
        let b = self.bucket(t);
        bump(&mut self.admitted, b, 1);
    }

    /// A physical attempt started at `t` on `route`.
    pub fn offered(&mut self, t: u64, route: usize) {
        let b = self.bucket(t);
        bump(&mut self.offered, b, 1);
        if let Some(v) = self.offered_by_route.get_mut(route) {
            bump(v, b, 1);
        }
    }

    /// A logical request admitted at `arrival` ended at `end`.
    pub fn finished(
        &mut self,
        arrival: u64,
        end: u64,
        success: bool,
        late: bool,
        attempts: u32,
        cost: u64,
    ) {
        self.requests = self.requests.saturating_add(1);
        self.latencies.push(end.saturating_sub(arrival));
        if success {
            self.successes = self.successes.saturating_add(1);
            let b = self.bucket(end);
            bump(&mut self.succeeded, b, 1);
        }
        if late {
            self.late = self.late.saturating_add(1);
        }
        self.attempts = self.attempts.saturating_add(u64::from(attempts));
        self.cost = self.cost.saturating_add(cost);
        if let Some((from, until)) = self.window {
            if from <= arrival && arrival < until {
                self.window_requests = self.window_requests.saturating_add(1);
                self.window_attempts = self.window_attempts.saturating_add(u64::from(attempts));
            }
        }
    }

    /// A retryledger run ended with `terminal`.
    pub fn terminal(&mut self, terminal: &'static str) {
        match self.terminals.iter_mut().find(|(t, _)| *t == terminal) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => self.terminals.push((terminal, 1)),
        }
    }
}
