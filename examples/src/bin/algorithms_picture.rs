//! One picture of the six algorithms: the same bursty trace through each, on the memory store
//! with a manual clock (the same rules as the Redis scripts), drawn as one SVG.
//!
//! ```sh
//! cargo run -p ratelimit-examples --bin algorithms_picture            # writes examples/algorithms.svg
//! cargo run -p ratelimit-examples --bin algorithms_picture -- out.svg
//! ```
//!
//! The trace, against 5 calls per second: a burst of 10 at the start, steady traffic at 10 a
//! second (twice the rate), a pause, then a second burst of 10 across the two-second boundary
//! (where the fixed window and the sliding counter's aligned windows turn over). Time runs
//! across; each algorithm has a lane; each call is a dot, filled when admitted, a cross when
//! rejected; the line in each lane is what that algorithm admitted in the trailing second,
//! against the dashed quota line.

use std::time::Duration;

use plotters::prelude::*;
use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{Algorithm, MemoryStore, Policy, store::Check};

/// Calls per period.
const NUM: u64 = 5;
/// The period, in ms.
const PERIOD_MS: u64 = 1000;

/// The times of the calls, in ms.
fn trace() -> Vec<u64> {
    let mut t: Vec<u64> = (0..10).map(|i| i * 10).collect();
    t.extend((0..10).map(|i| 300 + i * 100));
    t.extend((0..10).map(|i| 1950 + i * 10));
    t.extend((0..6).map(|i| 2400 + i * 100));
    t
}

/// Each call's time and whether `algorithm` admitted it.
fn run(
    algorithm: Algorithm,
    calls: &[u64],
) -> Result<Vec<(u64, bool)>, Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let policy = Policy::new(algorithm, NUM, Duration::from_millis(PERIOD_MS))?;
    let mut now = 0;
    let mut out = Vec::with_capacity(calls.len());
    for &t in calls {
        clock.advance(Duration::from_millis(t - now));
        now = t;
        let verdict = store.check_now(&[Check::new("caller", &policy)])?;
        out.push((t, verdict.is_admitted()));
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/algorithms.svg").to_owned());
    let calls = trace();
    let lanes = [
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::SlidingCounter,
        Algorithm::Token,
        Algorithm::Leaky,
        Algorithm::Gcra,
    ];
    let end = 3000_i32;
    let root = SVGBackend::new(&path, (960, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let lane_count = i32::try_from(lanes.len())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("The same calls through each algorithm: {NUM} per second"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(120)
        .build_cartesian_2d(0..end, -5..lane_count * 10 - 5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("time (ms)")
        .x_labels(7)
        .y_labels(lanes.len())
        .y_label_formatter(&|y| {
            // A label at each lane's calls (y = 0, 10, …; the top lane is the first).
            let lane = usize::try_from(*y / 10).unwrap_or(usize::MAX);
            lanes
                .len()
                .checked_sub(lane.saturating_add(1))
                .filter(|_| y % 10 == 0)
                .map_or_else(String::new, |i| lanes[i].as_str().to_owned())
        })
        .draw()?;
    for (i, &algorithm) in lanes.iter().enumerate() {
        let results = run(algorithm, &calls)?;
        // Lanes top to bottom: the first at the top. The calls sit on `base`; the load line runs
        // from `base - 4` (none) to `base + 4` (the quota, dashed).
        let base = (lane_count - 1 - i32::try_from(i)?) * 10;
        let quota = base + 4;
        chart.draw_series(DashedLineSeries::new(
            [(0, quota), (end, quota)],
            4,
            4,
            BLACK.mix(0.4).stroke_width(1),
        ))?;
        // What was admitted in the trailing second, scaled so that the quota is the dashed line.
        let admitted: Vec<u64> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
        let load = (0..=end).step_by(5).map(|t| {
            let t = u64::try_from(t).unwrap_or(0);
            let n = admitted
                .iter()
                .filter(|&&a| a <= t && a + PERIOD_MS > t)
                .count();
            let n = i32::try_from(n).unwrap_or(i32::MAX);
            let scaled = n * 8 / i32::try_from(NUM).unwrap_or(1);
            (i32::try_from(t).unwrap_or(0), base - 4 + scaled)
        });
        chart.draw_series(LineSeries::new(load, BLUE.mix(0.6).stroke_width(1)))?;
        for &(t, ok) in &results {
            let (x, y) = (i32::try_from(t)?, base);
            if ok {
                chart.draw_series(std::iter::once(Circle::new(
                    (x, y),
                    3,
                    GREEN.mix(0.9).filled(),
                )))?;
            } else {
                chart.draw_series(std::iter::once(Cross::new((x, y), 3, RED.stroke_width(1))))?;
            }
        }
        let (kept, total) = (admitted.len(), results.len());
        println!("{:<16} admitted {kept:>2} of {total}", algorithm.as_str());
    }
    root.present()?;
    println!("wrote {path}");
    Ok(())
}
