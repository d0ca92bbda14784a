//! The process's open-file limit (`RLIMIT_NOFILE`): every connection a
//! server holds is one descriptor, and a process that runs out of them
//! can no longer accept, open its database or write its log. At start a
//! server raises the soft limit to the hard one (what the Go runtime does
//! for every Go program, Nomad and Consul among them): the soft limit is
//! often 1,024, far below what the operator allowed.

/// The soft and hard limits on open files, after raising the soft one to
/// the hard one where the system lets it; `None` where they cannot be read.
pub fn raise_to_hard_limit() -> Option<OpenFiles> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit; RLIMIT_NOFILE is a
    // constant Linux defines.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above; raising the soft limit up to the hard one
        // needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Some(OpenFiles {
        soft: to_u64(lim.rlim_cur),
        hard: to_u64(lim.rlim_max),
        raised_from: (lim.rlim_cur != before).then(|| to_u64(before)),
    })
}

/// `RLIM_INFINITY` (and anything past `u64`) reads as `u64::MAX`.
fn to_u64(v: libc::rlim_t) -> u64 {
    if v == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        v
    }
}

/// The open-file limits of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// What the process may open now.
    pub soft: u64,
    /// The most the soft limit may be raised to without privilege.
    pub hard: u64,
    /// The soft limit before [`raise_to_hard_limit`] raised it, if it did.
    pub raised_from: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::raise_to_hard_limit;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let limits = raise_to_hard_limit().expect("getrlimit works on Linux");
        assert_eq!(limits.soft, limits.hard, "{limits:?}");
        // Raised again: nothing left to raise.
        let again = raise_to_hard_limit().expect("getrlimit");
        assert_eq!(again.soft, limits.soft);
        assert_eq!(again.raised_from, None);
    }
}
