//! One retry schedule for every place ferry tries again by itself (a leaf module): backon's
//! exponential backoff, doubling, capped, without jitter so waits are predictable. Its users:
//! webhook deliveries ([`crate::events::webhooks::backoff`]), the background finisher
//! (`upload/finishing.rs`), the S3 requests object_store does not send itself
//! (`blob/s3/compose.rs`, with backon's `Retryable`), and the lease and quota releases that run
//! after a request ended (`catalog::retry_transient`).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Waits of `first`, then doubling up to `max`, for as many attempts as the caller makes.
pub const fn doubling(first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new().with_min_delay(first).with_max_delay(max).with_factor(2.0).without_max_times()
}

/// The wait before the next attempt after `failed` failed ones (0: the first retry) on
/// `schedule`; past the cap it stays there. For retries whose count is kept elsewhere (the
/// catalog, a map of uploads) rather than in one running loop.
pub fn delay_after(schedule: ExponentialBuilder, failed: u32) -> Duration {
    // 64 doublings reach any cap a Duration can hold; the schedule does not run out
    // (`without_max_times`), the fallback is for one that would.
    schedule.without_max_times().build().nth(failed.min(64) as usize).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_wait_and_stays_at_the_cap() {
        let s = doubling(Duration::from_secs(1), Duration::from_secs(10));
        let waits: Vec<_> = (0..6).map(|n| delay_after(s, n)).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10].map(Duration::from_secs));
        assert_eq!(delay_after(s, u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn a_bounded_schedule_yields_its_waits_then_ends() {
        // backon multiplies in f32 seconds: whole milliseconds, give or take nanoseconds.
        let waits: Vec<_> = doubling(Duration::from_millis(100), Duration::from_secs(1)).with_max_times(3).build().map(|d| d.as_millis()).collect();
        assert_eq!(waits, [100, 200, 400]);
    }
}
