//! Commands queued for one connection and written to it together, once per pass of the
//! scheduler: concurrent checks reach Redis in one write and are read by it in one read, which
//! costs Redis and this process less per check than a write each.
//!
//! The connection's own pipelining only batches what is waiting when its writer task runs,
//! and Tokio runs a task woken by another task right after it: left alone, the writer wakes
//! after each check's command and writes it alone. Here a command sent while others wait for
//! their replies is queued; the first one queued spawns a flush that yields first, so every
//! check ready to run in this pass queues its command before the flush takes them all. A
//! command sent while none waits goes at once: alone, it has nothing to wait for. Flushes do
//! not wait for each other's replies: the connection keeps pipelining.
//!
//! A command may carry a deadline: its caller gets a timeout error once it passes, from one
//! timer per flush (at its earliest deadline), not one per command.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use redis::aio::{ConnectionLike as _, ConnectionManager};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;

use crate::store::guard::Deadline;

/// The most commands one pipeline carries; a flush splits more into several.
const MAX_BATCH: usize = 256;

/// A connection's queue of commands waiting for the next flush. Cheap to share.
pub(super) struct Queue {
    connection: ConnectionManager,
    /// Commands queued for the flush that the first of them spawned: while any wait, that
    /// flush has not yet taken them.
    waiting: Mutex<Vec<Queued>>,
    /// Commands sent (or queued) whose callers still wait for the reply.
    in_flight: AtomicUsize,
}

/// A queued command, where its reply goes, and by when.
type Queued = (Cmd, oneshot::Sender<RedisResult<Value>>, Option<Deadline>);

impl Queue {
    pub(super) fn new(connection: ConnectionManager) -> Arc<Self> {
        Arc::new(Self {
            connection,
            waiting: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
        })
    }

    /// The connection the commands are written to.
    pub(super) fn connection(&self) -> &ConnectionManager {
        &self.connection
    }

    /// Sends `command`, at once when no other command waits for its reply (nothing to write
    /// it with), else with the others queued in this pass; its reply, a server error as an
    /// `Err`, or a timeout error ([`passed`]) once `deadline` passes. Must be called within a
    /// Tokio runtime. If the caller stops waiting, the command is still sent.
    pub(super) async fn query(
        self: &Arc<Self>,
        command: Cmd,
        deadline: Option<Deadline>,
    ) -> RedisResult<Value> {
        let in_flight = InFlight::new(&self.in_flight);
        if in_flight.alone {
            // Boxed: the connection's future is large, and every queued command would carry
            // it too.
            let mut connection = self.connection.clone();
            let reply = Box::pin(within(deadline, connection.req_packed_command(&command)));
            return reply.await.and_then(Value::extract_error);
        }
        let (reply, replied) = oneshot::channel();
        let spawn = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.push((command, reply, deadline));
            waiting.len() == 1
        };
        if spawn {
            tokio::spawn(flush(Unflushed(Some(Arc::clone(self)))));
        }
        match replied.await {
            Ok(reply) => reply.and_then(Value::extract_error),
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "the command's flush ended without a reply",
            ))),
        }
    }

    /// The queued commands, leaving none: the next one queued spawns a flush.
    fn take(&self) -> Vec<Queued> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Yields, so that this pass's other checks queue their commands, then writes every queued
/// command as one pipeline (or several of [`MAX_BATCH`]) and hands out the replies.
async fn flush(unflushed: Unflushed) {
    BackOfTheQueue(false).await;
    let (queue, mut batch) = unflushed.take();
    while batch.len() > MAX_BATCH {
        let rest = batch.split_off(MAX_BATCH);
        tokio::spawn(send(queue.connection.clone(), batch));
        batch = rest;
    }
    send(queue.connection.clone(), batch).await;
}

/// A spawned flush's hold on its queue until it takes the commands. Dropped before (the
/// runtime shut down before the flush ran), it drops them, so that their callers get an error
/// rather than wait forever, and lets the next command spawn a flush.
struct Unflushed(Option<Arc<Queue>>);

impl Unflushed {
    fn take(mut self) -> (Arc<Queue>, Vec<Queued>) {
        let queue = self.0.take().expect("held until taken");
        let batch = queue.take();
        (queue, batch)
    }
}

impl Drop for Unflushed {
    fn drop(&mut self) {
        if let Some(queue) = self.0.take() {
            drop(queue.take());
        }
    }
}

/// Counts a caller waiting for a reply, from its creation to its drop.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// Whether no other caller was waiting.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::Relaxed) == 0;
        Self { count, alone }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ready on its second poll. On its first it wakes its task, which Tokio then runs again after
/// every task already waiting to run (`tokio::task::yield_now` also waits for the I/O driver,
/// which on an idle runtime costs a poll of it per check).
struct BackOfTheQueue(bool);

impl Future for BackOfTheQueue {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Writes `batch` as one pipeline and hands out the replies; a caller whose deadline passes
/// first gets a timeout error then, and the others still wait.
async fn send(mut connection: ConnectionManager, batch: Vec<Queued>) {
    let mut pipeline = redis::Pipeline::with_capacity(batch.len());
    // Where each reply goes, until it has gone.
    let mut replies = Vec::with_capacity(batch.len());
    for (command, reply, deadline) in batch {
        pipeline.add_command(command);
        replies.push((Some(reply), deadline));
    }
    let count = replies.len();
    let mut answer = std::pin::pin!(connection.req_packed_commands(&pipeline, 0, count));
    let outcome = loop {
        let waiting = replies.iter().filter(|(reply, _)| reply.is_some());
        let Some(deadline) = waiting.filter_map(|&(_, deadline)| deadline).min() else {
            break answer.await;
        };
        if let Ok(outcome) = tokio::time::timeout_at(deadline, &mut answer).await {
            break outcome;
        }
        for (reply, by) in &mut replies {
            if by.is_some_and(|by| by <= deadline)
                && let Some(reply) = reply.take()
            {
                let _ = reply.send(Err(passed()));
            }
        }
        if replies.iter().all(|(reply, _)| reply.is_none()) {
            return;
        }
    };
    let waiting = replies.into_iter().map(|(reply, _)| reply);
    match outcome {
        Ok(values) if values.len() == count => {
            for (reply, value) in waiting.zip(values) {
                // A caller that stopped waiting dropped its receiver: nothing to tell.
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(value));
                }
            }
        }
        Ok(values) => {
            let err = RedisError::from((
                ErrorKind::Parse,
                "a pipeline's replies did not match its commands",
                format!("{} replies for {count} commands", values.len()),
            ));
            for reply in waiting.flatten() {
                let _ = reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            for reply in waiting.flatten() {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

/// The error of a command whose deadline passed before its reply came.
pub(super) fn passed() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply by the check's deadline",
    ))
}

/// `call`, or a timeout error ([`passed`]) once `deadline` passes.
pub(super) async fn within<T>(
    deadline: Option<Deadline>,
    call: impl Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match deadline {
        None => call.await,
        Some(deadline) => tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or_else(|_| Err(passed())),
    }
}
