//! Hashing off the I/O path: a sha256 computed on a thread of its own over
//! buffers handed to it in order, so hashing an image as it arrives (or a
//! disk as it is read back) overlaps the network and the disk instead of
//! adding to them. The buffers go round: the I/O side fills a free one,
//! hands it over, and gets it back once it is hashed. A cut ends one digest
//! and starts the next, for a stream of runs each with its own sha256 (a
//! block-mapped image).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// Why the hashing thread is gone.
#[derive(Debug, thiserror::Error)]
#[error("the hashing thread stopped")]
pub struct HashThreadGone;

/// What the hashing thread is handed.
enum Piece<B> {
    /// The first `usize` bytes of a buffer, to hash after what came before.
    Data(B, usize),
    /// The end of a digest: the next bytes start a new one.
    Cut,
}

/// A sha256 over every buffer handed to [`Sha256Thread::hash`], in order
/// (one per run between [`Sha256Thread::cut`]s, each handed back as soon
/// as it is done).
pub struct Sha256Thread<B: AsRef<[u8]> + Send + 'static> {
    to_hash: Option<SyncSender<Piece<B>>>,
    free: Receiver<B>,
    /// The digest of each cut, as the thread finishes it.
    cuts: Receiver<[u8; 32]>,
    /// The thread; it ends with the digest in progress.
    handle: Option<JoinHandle<Sha256>>,
}

impl<B: AsRef<[u8]> + Send + 'static> Sha256Thread<B> {
    /// A hashing thread with these buffers to hand out: at least two, so
    /// that one is filled while another is hashed.
    pub fn spawn(buffers: Vec<B>) -> std::io::Result<Self> {
        let n = buffers.len().max(1);
        // Room for every buffer and a cut after each.
        let (to_hash, queued) = sync_channel::<Piece<B>>(2 * n);
        // Room for every buffer: neither side ever waits to give one back.
        let (give_back, free) = sync_channel::<B>(n);
        for b in buffers {
            let _ = give_back.send(b);
        }
        let (cut_done, cuts) = std::sync::mpsc::channel::<[u8; 32]>();
        let handle = std::thread::Builder::new()
            .name("bcd-sha256".into())
            .spawn(move || {
                let mut h = Sha256::new();
                for piece in queued {
                    match piece {
                        Piece::Data(buf, len) => {
                            h.update(&buf.as_ref()[..len]);
                            let _ = give_back.send(buf);
                        }
                        Piece::Cut => {
                            let _ = cut_done.send(std::mem::take(&mut h).finalize().into());
                        }
                    }
                }
                h
            })?;
        Ok(Self {
            to_hash: Some(to_hash),
            free,
            cuts,
            handle: Some(handle),
        })
    }

    /// The next free buffer; waits while every one is queued or hashed.
    pub fn buffer(&self) -> Result<B, HashThreadGone> {
        self.free.recv().map_err(|_| HashThreadGone)
    }

    /// Hashes the first `len` bytes of `buf`, after what was handed before.
    pub fn hash(&self, buf: B, len: usize) -> Result<(), HashThreadGone> {
        self.send(Piece::Data(buf, len))
    }

    /// Ends the digest of what was handed since the last cut.
    pub fn cut(&self) -> Result<(), HashThreadGone> {
        self.send(Piece::Cut)
    }

    fn send(&self, piece: Piece<B>) -> Result<(), HashThreadGone> {
        let tx = self.to_hash.as_ref().ok_or(HashThreadGone)?;
        tx.send(piece).map_err(|_| HashThreadGone)
    }

    /// The digests of the cuts finished since the last call, in order,
    /// without waiting for the others.
    pub fn finished_cuts(&self) -> Vec<[u8; 32]> {
        self.cuts.try_iter().collect()
    }

    fn join(&mut self) -> Result<Sha256, HashThreadGone> {
        drop(self.to_hash.take());
        self.handle
            .take()
            .ok_or(HashThreadGone)?
            .join()
            .map_err(|_| HashThreadGone)
    }

    /// The digest of everything handed since the last cut, once the thread
    /// has hashed it.
    pub fn finish(mut self) -> Result<[u8; 32], HashThreadGone> {
        Ok(self.join()?.finalize().into())
    }

    /// The digest of each run that a cut ended and
    /// [`Sha256Thread::finished_cuts`] did not hand back yet, in order.
    pub fn finish_cuts(mut self) -> Result<Vec<[u8; 32]>, HashThreadGone> {
        self.join()?;
        Ok(self.cuts.try_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_of_the_handed_bytes_in_order_whatever_the_buffers_held() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let t = Sha256Thread::spawn(vec![vec![0xAAu8; 4096], vec![0x55u8; 4096]]).expect("spawn");
        for piece in data.chunks(3000) {
            let mut buf = t.buffer().expect("a free buffer");
            buf[..piece.len()].copy_from_slice(piece);
            t.hash(buf, piece.len()).expect("hashed");
        }
        let got = t.finish().expect("digest");
        let want: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!(got, want);
    }

    #[test]
    fn each_cut_ends_the_digest_of_its_run() {
        let runs: [&[u8]; 3] = [
            b"the first run",
            b"",
            b"and the third, longer than a buffer",
        ];
        let t = Sha256Thread::spawn(vec![vec![0u8; 8], vec![0u8; 8]]).expect("spawn");
        for run in runs {
            for piece in run.chunks(8) {
                let mut buf = t.buffer().expect("a free buffer");
                buf[..piece.len()].copy_from_slice(piece);
                t.hash(buf, piece.len()).expect("hashed");
            }
            t.cut().expect("cut");
        }
        let want: Vec<[u8; 32]> = runs.iter().map(|r| Sha256::digest(r).into()).collect();
        // Some cuts may be done already; the rest come with the finish.
        let mut got = t.finished_cuts();
        assert!(got.len() <= runs.len());
        got.extend(t.finish_cuts().expect("digests"));
        assert_eq!(got, want);
    }

    #[test]
    fn nothing_handed_is_the_empty_digest() {
        let t = Sha256Thread::spawn(vec![vec![1u8; 16], vec![2u8; 16]]).expect("spawn");
        let want: [u8; 32] = Sha256::digest(b"").into();
        assert_eq!(t.finish().expect("digest"), want);
    }
}
