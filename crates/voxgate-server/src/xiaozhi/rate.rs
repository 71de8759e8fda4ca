//! Per-address request rate of the OTA and activation endpoints: a token bucket per source
//! address ([`super::activation::source_key`]: the IPv4 address, or the IPv6 /64), as
//! admission's handshake rate is for WebSocket upgrades.
//!
//! Pure: time comes in as `now`, the address as a value. A bucket holds `burst` requests and
//! refills at `per_sec`, so a device that boots, asks OTA and polls `/activate` a few times is
//! never slowed, while a script sending hundreds a second is answered `429` after its burst.
//! The tracked addresses are bounded: an address whose bucket is full again is forgotten (a
//! sweep every [`SWEEP_EVERY`], or at once when the table is full), and beyond
//! [`MAX_TRACKED`] addresses a new one is refused until the sweep frees room, so a flood from
//! many addresses cannot grow memory without bound.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::activation::source_key;

/// Most addresses tracked at once (tens of bytes each): far more than the devices that boot
/// within one refill, reached only by a flood from many addresses.
pub(crate) const MAX_TRACKED: usize = 65_536;

/// How often full buckets are forgotten, and how often a full table may be swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Why a request was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limited {
    /// This address is over its rate: it may ask again after this long (429).
    Rate(Duration),
    /// Too many addresses are tracked to track this one (503).
    Full,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Credit at `last`, in time: one request costs `cost`, the bucket holds `capacity`.
    credit: Duration,
    last: Instant,
}

/// Token buckets by source address.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    /// Credit one request costs; `None`: no limit.
    cost: Option<Duration>,
    capacity: Duration,
    buckets: HashMap<IpAddr, Bucket>,
    max_tracked: usize,
    last_sweep: Option<Instant>,
}

impl RateLimiter {
    /// `per_sec` requests a second per address after a burst of `burst` (at least one);
    /// `per_sec` 0: no limit.
    pub(crate) fn new(per_sec: u32, burst: u32) -> Self {
        Self::with_max_tracked(per_sec, burst, MAX_TRACKED)
    }

    fn with_max_tracked(per_sec: u32, burst: u32, max_tracked: usize) -> Self {
        let cost = (per_sec > 0).then(|| Duration::from_secs(1) / per_sec);
        Self {
            cost,
            capacity: cost.unwrap_or_default() * burst.max(1),
            buckets: HashMap::new(),
            max_tracked,
            last_sweep: None,
        }
    }

    /// Takes one request of `address` at `now`, or says why not.
    pub(crate) fn check(&mut self, now: Instant, address: IpAddr) -> Result<(), Limited> {
        let Some(cost) = self.cost else {
            return Ok(());
        };
        let key = source_key(address);
        let due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY);
        if due {
            self.sweep(now);
        }
        if !self.buckets.contains_key(&key) && self.buckets.len() >= self.max_tracked {
            return Err(Limited::Full);
        }
        let capacity = self.capacity;
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            credit: capacity,
            last: now,
        });
        bucket.credit = credit_at(bucket, now, capacity);
        bucket.last = now;
        if bucket.credit >= cost {
            bucket.credit -= cost;
            Ok(())
        } else {
            Err(Limited::Rate(cost - bucket.credit))
        }
    }

    /// Forgets the addresses whose bucket is full again: they would start from full anyway.
    fn sweep(&mut self, now: Instant) {
        let capacity = self.capacity;
        self.buckets
            .retain(|_, b| credit_at(b, now, capacity) < capacity);
        self.last_sweep = Some(now);
    }

    /// Addresses tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

fn credit_at(bucket: &Bucket, now: Instant, capacity: Duration) -> Duration {
    bucket
        .credit
        .saturating_add(now.saturating_duration_since(bucket.last))
        .min(capacity)
}

/// `Retry-After` seconds for a wait: whole seconds, rounded up, at least one.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_burst_then_the_rate() {
        let mut r = RateLimiter::new(5, 10);
        let t0 = Instant::now();
        let a = ip("203.0.113.9");
        for _ in 0..10 {
            r.check(t0, a).unwrap();
        }
        // The 11th in the same instant waits for one token: a fifth of a second.
        assert_eq!(
            r.check(t0, a),
            Err(Limited::Rate(Duration::from_millis(200)))
        );
        // 300 requests within 0.1 s: only the burst passes.
        let passed = (0..300)
            .filter(|i| r.check(t0 + Duration::from_micros(*i * 333), a).is_ok())
            .count();
        assert_eq!(passed, 0);
        // Another address has its own bucket.
        r.check(t0, ip("198.51.100.7")).unwrap();
        // A token comes back every 200 ms.
        let later = t0 + Duration::from_millis(400);
        r.check(later, a).unwrap();
        r.check(later, a).unwrap();
        assert!(matches!(r.check(later, a), Err(Limited::Rate(_))));
        // Two seconds refill the whole burst, and no more.
        let idle = later + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| r.check(idle, a).is_ok()).count(), 10);
    }

    #[test]
    fn zero_is_no_limit_and_ipv6_counts_by_network() {
        let mut off = RateLimiter::new(0, 10);
        let t = Instant::now();
        assert!((0..10_000).all(|_| off.check(t, ip("203.0.113.9")).is_ok()));
        assert_eq!(off.tracked(), 0);
        let mut r = RateLimiter::new(1, 2);
        r.check(t, ip("2001:db8:1:2::1")).unwrap();
        r.check(t, ip("2001:db8:1:2::2")).unwrap();
        assert!(r.check(t, ip("2001:db8:1:2::3")).is_err());
        r.check(t, ip("2001:db8:1:3::1")).unwrap();
    }

    #[test]
    fn tracked_addresses_are_bounded_and_forgotten_when_full() {
        let mut r = RateLimiter::with_max_tracked(5, 10, 3);
        let t0 = Instant::now();
        for n in 1..=3 {
            r.check(t0, ip(&format!("203.0.113.{n}"))).unwrap();
        }
        assert_eq!(r.check(t0, ip("203.0.113.4")), Err(Limited::Full));
        // Known addresses still pass.
        r.check(t0, ip("203.0.113.1")).unwrap();
        // Once their buckets refilled, they are forgotten and room comes back.
        let later = t0 + Duration::from_secs(3);
        r.check(later, ip("203.0.113.4")).unwrap();
        assert_eq!(r.tracked(), 1);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(200)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    }
}
