use redlock_sync::testing::Cluster;
use redlock_sync::Redlock;
use std::time::Duration;
fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let c = Cluster::start(5).unwrap();
    let l = Redlock::new(c.urls()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let l = &l;
            s.spawn(move || {
                for i in 0..20000 {
                    let k = l
                        .try_acquire(&format!("p{t}:{}", i % 64), Duration::from_secs(10))
                        .unwrap();
                    l.release(k).unwrap();
                }
            });
        }
    });
    eprintln!("{:?} per pair", t0.elapsed() / (20000 * threads as u32));
}
