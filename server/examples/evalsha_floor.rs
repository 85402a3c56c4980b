//! The Redis floor for `scripts/bench_server.sh`: the `EVALSHA` that tollgate-server sends Redis
//! for one call (captured from the server, arguments and all), called `CALLS` times by the Redis
//! client the library's store uses (one multiplexed connection, as the store keeps), `STREAMS` at
//! a time, as h2load's 64 streams call the server. Prints calls per second and the p50 / p99
//! latency: what Redis and the client alone allow tollgate-server with the Redis store.
//!
//! `cargo run --release -p tollgate-server --example evalsha_floor -- redis://127.0.0.1:6379 \
//!     CALLS STREAMS SHA KEY HEX_ARG...`

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, calls, streams, sha, key, hex_args @ ..] = &args[..] else {
        return Err("usage: evalsha_floor URL CALLS STREAMS SHA KEY HEX_ARG...".into());
    };
    let calls: usize = calls.parse()?;
    let streams: usize = streams.parse()?;
    let arguments = hex_args
        .iter()
        .map(|hex| decode_hex(hex))
        .collect::<Result<Vec<_>, _>>()?;
    let client = redis::Client::open(url.as_str())?;
    let connection = client.get_multiplexed_async_connection().await?;

    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|stream| {
            let mut connection = connection.clone();
            let (sha, key, arguments) = (sha.clone(), key.clone(), arguments.clone());
            // Each stream makes its share of the calls one after another.
            let share = calls / streams + usize::from(stream < calls % streams);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(share);
                let mut command = redis::cmd("EVALSHA");
                command.arg(&sha).arg(1).arg(&key);
                for argument in &arguments {
                    command.arg(argument.as_slice());
                }
                for _ in 0..share {
                    let asked = Instant::now();
                    let _: redis::Value = command.query_async(&mut connection).await?;
                    latencies.push(asked.elapsed());
                }
                Ok::<_, redis::RedisError>(latencies)
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::with_capacity(calls);
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |quantile: f64| {
        latencies[((latencies.len() as f64 * quantile) as usize).min(latencies.len() - 1)]
    };
    println!(
        "{:.2} req/s p50 {} us p99 {} us",
        calls as f64 / elapsed.as_secs_f64(),
        at(0.50).as_micros(),
        at(0.99).as_micros()
    );
    Ok(())
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if hex.len() % 2 != 0 {
        return Err(format!("{hex}: an odd number of hex digits"));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| format!("{hex}: {e}")))
        .collect()
}
