//! CPU time spent polling one future: the sum, over its polls, of the
//! polling thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`). It is the CPU
//! this process spent on that piece of work, wherever the runtime ran it,
//! and not the time it waited (for a lock, the database, the network),
//! which is what a wall-clock timer would add. Services run on one tokio
//! runtime in one process; this is how a piece of their work is priced.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The CPU clock of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant Linux defines. On failure the clock reads zero.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

pin_project_lite::pin_project! {
    /// A future with the CPU time its polls took; see [`cpu_timed`].
    pub struct CpuTimed<F> {
        #[pin]
        inner: F,
        spent: Duration,
    }
}

/// Wraps `fut` so that its output comes with the CPU time its polls took.
pub fn cpu_timed<F: Future>(fut: F) -> CpuTimed<F> {
    CpuTimed {
        inner: fut,
        spent: Duration::ZERO,
    }
}

impl<F: Future> Future for CpuTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let start = thread_cpu();
        let polled = this.inner.poll(cx);
        *this.spent += thread_cpu().saturating_sub(start);
        match polled {
            Poll::Ready(out) => Poll::Ready((out, *this.spent)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_the_work_of_its_polls_and_not_its_waits() {
        // A fixed amount of work: its CPU time does not depend on how
        // loaded the machine is, only its wall time does.
        let (sum, busy) = cpu_timed(async {
            let mut x = 0u64;
            for i in 0..30_000_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
            x
        })
        .await;
        assert!(sum > 0);
        let ((), idle) = cpu_timed(tokio::time::sleep(Duration::from_millis(100))).await;
        assert!(busy > Duration::ZERO, "busy: {busy:?}");
        assert!(
            idle * 10 < busy,
            "a 100 ms sleep costs next to nothing: idle {idle:?}, busy {busy:?}"
        );
    }
}
