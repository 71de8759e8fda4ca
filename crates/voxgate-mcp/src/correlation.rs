//! The table of requests awaiting a reply, each with its own deadline.

use std::collections::HashMap;
use std::time::Instant;

use crate::jsonrpc::Id;

/// Requests in flight, keyed by id, with per-request deadlines.
///
/// `T` is whatever the owner needs to finish the request (which call it was, the tool name...).
/// Lookups of a string id that holds a decimal number also find the numeric entry, because some
/// relays stringify ids.
#[derive(Debug, Clone)]
pub struct Correlation<T> {
    pending: HashMap<Id, Pending<T>>,
}

#[derive(Debug, Clone)]
struct Pending<T> {
    deadline: Option<Instant>,
    context: T,
}

/// Inserting an id that is already in flight: a caller bug (ids must be unique).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request id {0} is already in flight")]
pub struct DuplicateId(pub Id);

impl<T> Default for Correlation<T> {
    fn default() -> Self {
        Correlation {
            pending: HashMap::new(),
        }
    }
}

impl<T> Correlation<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tracks a request until its reply arrives or `deadline` passes (`None`: no deadline).
    pub fn insert(
        &mut self,
        id: Id,
        deadline: Option<Instant>,
        context: T,
    ) -> Result<(), DuplicateId> {
        if self.pending.contains_key(&id) {
            return Err(DuplicateId(id));
        }
        self.pending.insert(id, Pending { deadline, context });
        Ok(())
    }

    /// Removes and returns the request answered by a reply carrying `id`.
    pub fn remove(&mut self, id: &Id) -> Option<T> {
        if let Some(p) = self.pending.remove(id) {
            return Some(p.context);
        }
        match id {
            Id::String(_) => {
                let n = id.as_number()?;
                self.pending.remove(&Id::Number(n)).map(|p| p.context)
            }
            _ => None,
        }
    }

    /// Whether `id` is in flight.
    pub fn contains(&self, id: &Id) -> bool {
        self.pending.contains_key(id)
    }

    /// The context of an in-flight request.
    pub fn get(&self, id: &Id) -> Option<&T> {
        self.pending.get(id).map(|p| &p.context)
    }

    /// The earliest deadline, for `poll_timeout`.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().filter_map(|p| p.deadline).min()
    }

    /// Removes every request whose deadline is at or before `now`, earliest first (ties by id
    /// order of insertion are not guaranteed; ids break them deterministically for numbers).
    pub fn expire(&mut self, now: Instant) -> Vec<(Id, T)> {
        let mut due: Vec<(Instant, Id)> = self
            .pending
            .iter()
            .filter_map(|(id, p)| p.deadline.filter(|d| *d <= now).map(|d| (d, id.clone())))
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        due.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.as_number().cmp(&b.1.as_number()))
        });
        due.into_iter()
            .filter_map(|(_, id)| self.pending.remove(&id).map(|p| (id, p.context)))
            .collect()
    }

    /// Removes every request (the transport closed), in id order for numeric ids.
    pub fn drain(&mut self) -> Vec<(Id, T)> {
        let mut all: Vec<(Id, T)> = self
            .pending
            .drain()
            .map(|(id, p)| (id, p.context))
            .collect();
        all.sort_by_key(|a| a.0.as_number());
        all
    }

    /// Number of requests in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn deadlines_expire_in_order_and_replies_remove() {
        let t0 = Instant::now();
        let mut c = Correlation::new();
        c.insert(Id::Number(1), Some(t0 + Duration::from_secs(3)), "a")
            .unwrap();
        c.insert(Id::Number(2), Some(t0 + Duration::from_secs(1)), "b")
            .unwrap();
        c.insert(Id::Number(3), None, "c").unwrap();
        assert_eq!(
            c.insert(Id::Number(3), None, "d"),
            Err(DuplicateId(Id::Number(3)))
        );
        assert_eq!(c.next_deadline(), Some(t0 + Duration::from_secs(1)));
        assert!(c.expire(t0).is_empty());
        assert_eq!(
            c.expire(t0 + Duration::from_secs(5)),
            vec![(Id::Number(2), "b"), (Id::Number(1), "a")]
        );
        assert_eq!(c.next_deadline(), None);
        assert_eq!(c.remove(&Id::from("3")), Some("c"));
        assert!(c.is_empty());
    }

    #[test]
    fn drain_returns_everything() {
        let mut c = Correlation::new();
        c.insert(Id::Number(2), None, ()).unwrap();
        c.insert(Id::Number(1), None, ()).unwrap();
        assert_eq!(c.drain(), vec![(Id::Number(1), ()), (Id::Number(2), ())]);
        assert_eq!(c.len(), 0);
    }
}
