//! The statsd sink of the Envoy ratelimit service's statistics: every flush interval, the
//! counters' increases since the last push (see `crate::metrics::statsd`), to statsd
//! (`USE_STATSD`, over TCP, as the Envoy service's statsd sink writes) or DogStatsD
//! (`USE_DOG_STATSD`, over UDP).

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::config::Statsd;
use crate::metrics::statsd::increases;

/// The lines of one push: `name:increase|c`, with the sink's tags as the Envoy service's
/// sinks write them (statsd: in the name, `.__key=value`, keys sorted; DogStatsD:
/// `|#key:value`).
fn lines(sink: &Statsd, increases: &[(String, u64)]) -> Vec<String> {
    let clean = |s: &str| s.replace(['.', ':', '|'], "_");
    let mut tags = sink.tags.clone();
    tags.sort();
    let in_name: String = if sink.dog {
        String::new()
    } else {
        tags.iter()
            .map(|(k, v)| format!(".__{}={}", clean(k), clean(v)))
            .collect()
    };
    let dog_tags = if sink.dog && !tags.is_empty() {
        let list: Vec<String> = tags
            .iter()
            .map(|(k, v)| format!("{}:{}", clean(k), clean(v)))
            .collect();
        format!("|#{}", list.join(","))
    } else {
        String::new()
    };
    increases
        .iter()
        .map(|(name, n)| format!("{name}{in_name}:{n}|c{dog_tags}\n"))
        .collect()
}

/// Pushes the statistics' increases to `sink` every flush interval, for ever. A sink that
/// cannot be reached is logged the first time in a row, and its increases are kept for the
/// next push (TCP) or dropped (UDP, as datagrams are).
pub async fn push(sink: Statsd) {
    let address = format!("{}:{}", sink.host, sink.port);
    tracing::info!(%address, dog = sink.dog, flush = ?sink.flush, "pushing statistics to statsd");
    let mut every = tokio::time::interval(sink.flush);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tcp: Option<tokio::net::TcpStream> = None;
    let mut failing = false;
    let mut held: Vec<String> = Vec::new();
    loop {
        every.tick().await;
        held.extend(lines(&sink, &increases()));
        if held.is_empty() {
            continue;
        }
        let sent = if sink.dog {
            send_udp(&address, &held).await
        } else {
            send_tcp(&address, &mut tcp, &held).await
        };
        match sent {
            Ok(()) => {
                held.clear();
                if failing {
                    tracing::info!(%address, "statsd reached again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%address, error = %e, "cannot push statistics to statsd");
                }
                failing = true;
                tcp = None;
                if sink.dog {
                    held.clear();
                }
                // Bounded: a sink down for long keeps the newest lines only.
                if held.len() > 100_000 {
                    held.drain(..held.len() - 100_000);
                }
            }
        }
    }
}

async fn send_tcp(
    address: &str,
    stream: &mut Option<tokio::net::TcpStream>,
    lines: &[String],
) -> std::io::Result<()> {
    if stream.is_none() {
        let connect = tokio::net::TcpStream::connect(address);
        let connected = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        connected.set_nodelay(true)?;
        *stream = Some(connected);
    }
    let Some(stream) = stream.as_mut() else {
        return Ok(());
    };
    let text = lines.concat();
    tokio::time::timeout(Duration::from_secs(2), stream.write_all(text.as_bytes()))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// Sends `lines` in datagrams of at most 1,432 bytes (one Ethernet frame), whole lines each.
async fn send_udp(address: &str, lines: &[String]) -> std::io::Result<()> {
    let socket = tokio::net::UdpSocket::bind(if address.starts_with('[') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    })
    .await?;
    socket.connect(address).await?;
    let mut datagram = String::new();
    for line in lines {
        if !datagram.is_empty() && datagram.len() + line.len() > 1_432 {
            socket.send(datagram.as_bytes()).await?;
            datagram.clear();
        }
        datagram.push_str(line);
    }
    if !datagram.is_empty() {
        socket.send(datagram.as_bytes()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::statsd::{Stat, counters};

    fn sink(dog: bool) -> Statsd {
        Statsd {
            host: "localhost".into(),
            port: 8125,
            dog,
            flush: Duration::from_secs(10),
            tags: vec![
                ("zone".into(), "eu.1".into()),
                ("app".into(), "shop".into()),
            ],
        }
    }

    #[test]
    fn tags_are_written_as_each_sink_writes_them() {
        let increases = [(
            "ratelimit.service.rate_limit.shop.cart.total_hits".into(),
            3,
        )];
        assert_eq!(
            lines(&sink(false), &increases),
            ["ratelimit.service.rate_limit.shop.cart.total_hits.__app=shop.__zone=eu_1:3|c\n"]
        );
        assert_eq!(
            lines(&sink(true), &increases),
            ["ratelimit.service.rate_limit.shop.cart.total_hits:3|c|#app:shop,zone:eu_1\n"]
        );
    }

    #[test]
    fn a_push_sends_what_grew_since_the_last() {
        let counters = counters("unit_test_domain.key");
        counters.add(Stat::TotalHits, 5);
        counters.add(Stat::OverLimit, 2);
        let first = increases();
        assert!(first.contains(&(
            "ratelimit.service.rate_limit.unit_test_domain.key.total_hits".into(),
            5
        )));
        counters.add(Stat::TotalHits, 1);
        let second: Vec<_> = increases()
            .into_iter()
            .filter(|(n, _)| n.contains("unit_test_domain"))
            .collect();
        assert_eq!(
            second,
            [(
                "ratelimit.service.rate_limit.unit_test_domain.key.total_hits".into(),
                1
            )]
        );
    }
}
