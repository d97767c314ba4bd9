//! Sources: where rows enter braid. [`route`] maps an MQTT topic to the streams whose `topic`
//! filter it matches and the fields their `+name` levels capture.
//!
//! A source's network side (the MQTT client on the io thread) hands each received message to the
//! service's feeder as a [`Delivery`] over a bounded channel, numbered in receive order. The
//! feeder journals it and puts its row into the shard's ring, then confirms its number through
//! [`Confirmations`]; only then does the source send the PUBACK (at-least-once: a crash never
//! loses an acknowledged message). A full channel is backpressure: the source keeps polling (the
//! connection stays alive) but stops acknowledging, so the broker stops sending.

pub mod mqtt;
pub mod relay;
pub mod route;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// One message received by source `source`.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The source's index in `Plan::sources`.
    pub source: usize,
    /// Receive order within the source, from 1, never reused (also not across reconnects).
    pub seq: u64,
    pub topic: String,
    pub payload: Bytes,
    /// Processing time of its arrival, ms since the Unix epoch.
    pub arrival: i128,
    /// The broker sent it before (MQTT's DUP flag): braid may already hold it in its journal.
    pub redelivered: bool,
}

/// Per source: the highest [`Delivery::seq`] whose row is safely in braid (journaled and in its
/// shard's ring), and a wake-up for the source's task. Written by the feeder, read by the sources.
#[derive(Debug)]
pub struct Confirmations {
    confirmed: Vec<AtomicU64>,
    wake: Vec<Arc<tokio::sync::Notify>>,
}

impl Confirmations {
    pub fn new(sources: usize) -> Arc<Confirmations> {
        Arc::new(Confirmations {
            confirmed: (0..sources).map(|_| AtomicU64::new(0)).collect(),
            wake: (0..sources).map(|_| Arc::new(tokio::sync::Notify::new())).collect(),
        })
    }

    /// Every delivery of `source` up to `seq` is safe (the feeder calls this).
    pub fn confirm(&self, source: usize, seq: u64) {
        if self.confirmed[source].fetch_max(seq, Ordering::AcqRel) < seq {
            self.wake[source].notify_one();
        }
    }

    /// The highest confirmed delivery of `source`.
    pub fn confirmed(&self, source: usize) -> u64 {
        self.confirmed[source].load(Ordering::Acquire)
    }

    /// Woken after a confirmation of `source` (a source task awaits `notified()`).
    pub fn waker(&self, source: usize) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.wake[source])
    }
}

/// The row of a decoded line or payload of stream `def`: its key (broadcast when the stream has
/// none or the value is no key), its stable id (CONTRACT.md rule 10: stream name and declared
/// values in field-name order) and its event time `ts`.
pub fn row_of(
    def: &crate::config::StreamDef,
    values: Vec<crate::record::Value>,
    ts: i64,
    ids: &mut crate::record::id::IdHasher,
) -> crate::record::Row {
    use crate::record::{Key, Row};
    let key = def.schema.key_of(&values).unwrap_or(Key::Broadcast);
    ids.begin().str(&def.name);
    for &pos in &def.schema.id_order {
        ids.value(&values[pos]);
    }
    Row { ts, key_hash: crate::record::id::key_hash(&key), key, id: ids.finish(), values: values.into() }
}

/// The sending end of the intake channel: hands a delivery to the feeder and rings its doorbell,
/// so a feeder asleep between ticks takes it at once.
#[derive(Clone)]
pub struct Intake {
    tx: crossbeam_channel::Sender<Delivery>,
    bell: Arc<crate::shard::wake::Doorbell>,
}

impl Intake {
    pub fn new(tx: crossbeam_channel::Sender<Delivery>, bell: Arc<crate::shard::wake::Doorbell>) -> Intake {
        Intake { tx, bell }
    }

    /// Hands `delivery` over, or gives it back when the channel is full (backpressure) or the
    /// feeder is gone.
    pub fn try_send(&self, delivery: Delivery) -> Result<(), crossbeam_channel::TrySendError<Delivery>> {
        self.tx.try_send(delivery)?;
        self.bell.ring();
        Ok(())
    }
}
