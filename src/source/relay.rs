//! The trimming relay: how a PUBLISH larger than every limit gets through an MQTT 3.1.1 session
//! without stalling the queue behind it.
//!
//! Design:
//! - **The problem.** rumqttc's v4 client reads whole packets. Its incoming limit makes a bigger
//!   packet a connection error (`PayloadSizeLimitExceeded`) before the packet is read; the broker
//!   then redelivers it to the persistent session at every reconnect, first in line, forever
//!   (seen: one 20 MiB publish halted all ingestion, braid reconnected ~13 times a second, and
//!   only deleting the broker session helped). Raising the limit means holding the packet in
//!   memory, which only moves the problem to the next larger packet (MQTT allows 256 MiB).
//! - **The way.** After such an error the source's next connection goes through this relay, a
//!   loopback TCP listener in braid's own process that connects on to the broker (TLS included,
//!   with the source's own rustls configuration). It copies everything through unchanged except a
//!   broker→braid PUBLISH whose remaining length is over the source's incoming limit: that one is
//!   forwarded with the same flags, topic and packet id and only the first `keep` bytes of its
//!   payload (`max_payload + 1`), the rest read and discarded in 64 KiB chunks. The source then
//!   receives an ordinary message one byte over `max_payload`, the feeder dead-letters it as
//!   `oversized` (its first KiB in `raw`, counted in `braid_stream_dead_letter_total`), and it is
//!   acknowledged in receive order like any other. Memory stays bounded by the incoming limit.
//! - **Only for that connection.** The source restores its direct connection at the next
//!   ConnAck (the options are read at connect time): the relay is a detour of one session, not a
//!   hop every message pays for. The listener stays up (idle) for the next time.
//! - **Not MQTT 5's Maximum Packet Size.** A v5 client announcing it makes the broker drop
//!   bigger messages itself (mosquitto 2.0.11 logs "Dropping too large outgoing PUBLISH" and
//!   goes on); braid would neither see nor count them, and the source would have to move to
//!   rumqttc's v5 client. The broker-side limit belongs in the broker: README's mosquitto recipe
//!   sets `message_size_limit`, which refuses such a publish at the door.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rumqttc::tokio_rustls::TlsConnector;
use rumqttc::{MqttOptions, TlsConfiguration, Transport};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// MQTT control packet type of PUBLISH (the high nibble of the first byte).
const PUBLISH: u8 = 3;
/// Discarded payload is read in chunks of this size.
const DISCARD_CHUNK: usize = 64 << 10;

/// Where the relay connects on to: the source's broker as its options name it.
#[derive(Clone)]
pub struct Upstream {
    host: String,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Upstream {
    /// The broker of `options`; `None` for a transport the relay cannot speak (only TCP and
    /// rustls TLS are used by braid).
    pub fn of(options: &MqttOptions) -> Option<Upstream> {
        let (host, port) = options.broker_address();
        let tls = match options.transport() {
            Transport::Tcp => None,
            Transport::Tls(TlsConfiguration::Rustls(config)) => Some(config),
            _ => return None,
        };
        Some(Upstream { host, port, tls })
    }
}

/// A running relay (stopped when dropped).
pub struct Relay {
    /// Its loopback port.
    pub port: u16,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Starts a relay on 127.0.0.1 (a free port) to `upstream` that trims a PUBLISH with a remaining
/// length over `limit` to `keep` payload bytes, counting them in `trimmed`. Must run inside a
/// tokio runtime.
pub fn start(upstream: Upstream, limit: usize, keep: usize, trimmed: Arc<AtomicU64>) -> std::io::Result<Relay> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let listener = TcpListener::from_std(listener)?;
    let counter = trimmed;
    let accept = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, trimmed) = (upstream.clone(), Arc::clone(&counter));
            tokio::spawn(async move {
                if let Err(error) = relay(client, &upstream, limit, keep, &trimmed).await {
                    tracing::debug!(%error, "MQTT relay connection ended");
                }
            });
        }
    });
    Ok(Relay { port, accept })
}

/// One connection: braid's client on `client`, the broker dialled now; ends when either ends.
async fn relay(
    client: TcpStream,
    upstream: &Upstream,
    limit: usize,
    keep: usize,
    trimmed: &AtomicU64,
) -> std::io::Result<()> {
    let broker = TcpStream::connect((upstream.host.as_str(), upstream.port)).await?;
    client.set_nodelay(true)?;
    broker.set_nodelay(true)?;
    match &upstream.tls {
        None => pipe(client, broker, limit, keep, trimmed).await,
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(upstream.host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let broker = TlsConnector::from(Arc::clone(config)).connect(name, broker).await?;
            pipe(client, broker, limit, keep, trimmed).await
        }
    }
}

async fn pipe<B: AsyncRead + AsyncWrite + Unpin>(
    client: TcpStream,
    broker: B,
    limit: usize,
    keep: usize,
    trimmed: &AtomicU64,
) -> std::io::Result<()> {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut broker_rx, mut broker_tx) = tokio::io::split(broker);
    let upward = async {
        tokio::io::copy(&mut client_rx, &mut broker_tx).await?;
        broker_tx.shutdown().await
    };
    let downward = forward_packets(&mut broker_rx, &mut client_tx, limit, keep, trimmed);
    tokio::select! {
        done = upward => done,
        done = downward => done,
    }
}

/// Copies MQTT packets from `from` to `to`, trimming an over-limit PUBLISH (module doc).
pub async fn forward_packets<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    from: &mut R,
    to: &mut W,
    limit: usize,
    keep: usize,
    trimmed: &AtomicU64,
) -> std::io::Result<()> {
    let mut header = Vec::with_capacity(5);
    loop {
        header.clear();
        let first = match from.read_u8().await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return to.shutdown().await,
            Err(e) => return Err(e),
        };
        header.push(first);
        let remaining = read_remaining_length(from, &mut header).await?;
        if first >> 4 == PUBLISH && remaining > limit {
            trim_publish(from, to, first, remaining, keep).await?;
            trimmed.fetch_add(1, Ordering::Relaxed);
        } else {
            to.write_all(&header).await?;
            let copied = tokio::io::copy(&mut (&mut *from).take(remaining as u64), to).await?;
            if copied < remaining as u64 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        to.flush().await?;
    }
}

/// The variable-length "remaining length" after the first byte (MQTT 3.1.1 §2.2.3), its bytes
/// appended to `header`.
async fn read_remaining_length<R: AsyncRead + Unpin>(from: &mut R, header: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut value = 0usize;
    for shift in [0, 7, 14, 21] {
        let byte = from.read_u8().await?;
        header.push(byte);
        value |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "MQTT remaining length longer than 4 bytes"))
}

/// Forwards a PUBLISH of `remaining` bytes after its fixed header with only `keep` bytes of its
/// payload; the rest is read and dropped.
async fn trim_publish<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    from: &mut R,
    to: &mut W,
    first: u8,
    remaining: usize,
    keep: usize,
) -> std::io::Result<()> {
    let qos = (first >> 1) & 0b11;
    let topic_len = usize::from(from.read_u16().await?);
    let variable = 2 + topic_len + if qos > 0 { 2 } else { 0 };
    let Some(payload_len) = remaining.checked_sub(variable) else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "PUBLISH shorter than its topic"));
    };
    let kept = payload_len.min(keep);
    let mut packet = Vec::with_capacity(variable + kept);
    packet.extend_from_slice(&(topic_len as u16).to_be_bytes());
    packet.resize(variable + kept, 0);
    from.read_exact(&mut packet[2..]).await?;
    let mut fixed = vec![first];
    encode_remaining_length(packet.len(), &mut fixed);
    to.write_all(&fixed).await?;
    to.write_all(&packet).await?;
    let mut rest = payload_len - kept;
    let mut scratch = vec![0; DISCARD_CHUNK.min(rest)];
    while rest > 0 {
        let n = rest.min(scratch.len());
        from.read_exact(&mut scratch[..n]).await?;
        rest -= n;
    }
    Ok(())
}

fn encode_remaining_length(mut len: usize, out: &mut Vec<u8>) {
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PUBLISH packet (QoS 1, packet id 7) of `topic` and `payload`.
    fn publish(topic: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(topic.as_bytes());
        body.extend_from_slice(&7u16.to_be_bytes());
        body.extend_from_slice(payload);
        let mut packet = vec![0x32];
        encode_remaining_length(body.len(), &mut packet);
        packet.extend_from_slice(&body);
        packet
    }

    async fn forwarded(input: Vec<u8>, limit: usize, keep: usize) -> (Vec<u8>, u64) {
        let trimmed = AtomicU64::new(0);
        let mut out = Vec::new();
        forward_packets(&mut input.as_slice(), &mut out, limit, keep, &trimmed).await.expect("well-formed input");
        (out, trimmed.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn small_packets_pass_unchanged_and_a_big_publish_is_trimmed_in_place() {
        let ping = vec![0xd0, 0x00];
        let small = publish("devices/d1/status", b"{\"ts\":1}");
        let big = publish("devices/d2/status", &vec![b'x'; 3 << 20]);
        let after = publish("devices/d3/status", b"{}");
        let input = [ping.clone(), small.clone(), big, after.clone()].concat();
        let (out, trimmed) = forwarded(input, 1000, 101).await;
        let expected = [ping, small, publish("devices/d2/status", &[b'x'; 101]), after].concat();
        assert_eq!(trimmed, 1);
        assert_eq!(out, expected);
    }

    #[tokio::test]
    async fn a_publish_at_the_limit_is_kept_whole() {
        let packet = publish("t", &[b'y'; 100]);
        let remaining = packet.len() - 2;
        let (out, trimmed) = forwarded(packet.clone(), remaining, 10).await;
        assert_eq!((out, trimmed), (packet, 0));
    }

    #[tokio::test]
    async fn a_truncated_stream_is_an_error_not_a_short_packet() {
        let mut packet = publish("t", &[b'z'; 100]);
        packet.truncate(50);
        let mut out = Vec::new();
        let result = forward_packets(&mut packet.as_slice(), &mut out, 1000, 10, &AtomicU64::new(0)).await;
        assert!(result.is_err());
    }

    #[test]
    fn remaining_lengths_round_trip() {
        for len in [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455] {
            let mut bytes = Vec::new();
            encode_remaining_length(len, &mut bytes);
            let mut header = Vec::new();
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let read = rt.block_on(read_remaining_length(&mut bytes.as_slice(), &mut header)).expect("valid");
            assert_eq!((read, header), (len, bytes));
        }
    }
}
