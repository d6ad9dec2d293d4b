//! tollgate's own pipelined connection to one Redis server (TCP, TLS or a Unix socket): the
//! commands of concurrent checks are written together and their replies read in order, with
//! one task writing and one reading, and no client library between a check and the socket.
//! A check, packed straight into the connection's buffer ([`Command`]), costs the process
//! about 3k fewer instructions this way than through redis-rs's multiplexed connection, its
//! channel, driver task and generic reply parser (BENCHMARKS.md); redis-rs still parses the
//! URL, builds the store's rarer commands and its errors, and is the Cluster client.
//!
//! Commands are written together once per pass of the scheduler. Tokio runs a task woken by
//! another right after it, so a writer woken by each command would write each alone; here a
//! command sent while others wait for their replies is queued, and the writer, woken by the
//! first of them, yields first, so that every check ready to run in this pass queues its
//! command before the writer takes them all in one write. A command sent while none waits is
//! written at once: alone, it has nothing to wait for.
//!
//! A command may carry a deadline: its caller gets a timeout error once it passes, from the
//! reader's one timer (at the earliest deadline waiting), not a timer per command. A link whose
//! oldest command has waited [`RESPONSE_TIMEOUT`] for its reply is taken as dead: every caller
//! waiting on it gets an error, and the next command connects again. So does a link whose
//! socket fails, or whose tasks stop with their runtime.
//!
//! Replies are read as RESP2 (the connection never asks for RESP3): simple strings, errors,
//! integers, bulk strings and arrays. Bytes that cannot be one (a server that is not Redis)
//! are a protocol error as soon as they arrive, which closes the link as a lost one does.

use std::collections::VecDeque;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::store::guard::Deadline;

/// How long a link's oldest command may wait for its reply before the link is taken as dead.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long establishing a link (connecting, TLS, `AUTH`, `SELECT`) may take.
const CONNECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// After a failed attempt to connect, the next waits this long, doubled after each.
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// Attempts to connect in a row before the callers waiting get an error.
const CONNECT_ATTEMPTS: u32 = 3;

/// Nesting of arrays a reply may have; deeper is a protocol error, not a deep recursion.
const MAX_DEPTH: usize = 32;

/// The largest bulk string a reply may hold (Redis's own `proto-max-bulk-len` default).
const MAX_BULK: usize = 512 * 1024 * 1024;

/// The longest line (a status, an error, a number, a header) a reply may have, far beyond any
/// Redis sends; a longer one is a protocol error rather than a buffer that grows for good.
const MAX_LINE: usize = 1024 * 1024;

/// A connection to one server, established on first use and again after a failure. Cheap to
/// share: clones of its `Arc` write to the same link.
pub(super) struct Wire {
    info: ConnectionInfo,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The established link, if any (it may have closed since: see [`Link::closed`]).
    link: Mutex<Option<Arc<Link>>>,
    /// One caller's attempts to connect at a time, and the error of the last that failed.
    connecting: tokio::sync::Mutex<Option<RedisError>>,
    /// Callers' rounds of attempts finished, to tell a waiting caller that one ended.
    attempts: AtomicUsize,
}

impl Wire {
    /// A connection to the server `info` names, with `tls` for a `rediss://` address. Connects
    /// on first use.
    pub(super) fn new(info: ConnectionInfo, tls: Option<Arc<rustls::ClientConfig>>) -> Arc<Self> {
        Arc::new(Self {
            info,
            tls,
            link: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(None),
            attempts: AtomicUsize::new(0),
        })
    }

    /// Sends `command`; its reply, a server error as an `Err`, or a timeout error
    /// ([`passed`]) once `deadline` passes. Must be called within a Tokio runtime. If the
    /// caller stops waiting, the command is still sent.
    pub(super) async fn query(
        &self,
        command: &impl Command,
        deadline: Option<Deadline>,
    ) -> RedisResult<Value> {
        self.request(|out| command.pack(out), 1, deadline)
            .await
            .and_then(Value::extract_error)
    }

    /// A handle that runs redis-rs's own calls (a script's `EVALSHA` and its load) on this
    /// connection.
    pub(super) fn handle(self: &Arc<Self>) -> Handle {
        Handle(Arc::clone(self))
    }

    /// Writes what `write` packs (`replies` commands) and returns their replies: the one
    /// reply, or an array of them; a server error as a value.
    async fn request(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
        replies: usize,
        deadline: Option<Deadline>,
    ) -> RedisResult<Value> {
        let link = match self.current() {
            Some(link) => link,
            // StoreFuture: connecting (TLS included) is a large future, which every check's
            // future would otherwise carry, and move.
            None => Box::pin(within(deadline, self.connect())).await?,
        };
        let replied = link.send(write, replies, deadline)?;
        drop(link);
        replied
            .await
            .unwrap_or_else(|_| Err(io_error("the connection closed without a reply")))
    }

    /// The link, if established and open.
    fn current(&self) -> Option<Arc<Link>> {
        let link = lock(&self.link);
        link.as_ref()
            .filter(|link| !link.closed.load(Ordering::Acquire))
            .cloned()
    }

    /// Establishes a link: up to [`CONNECT_ATTEMPTS`] attempts, [`RETRY_DELAY`] apart and
    /// doubling, by one caller at a time. Callers that waited for another's attempts take
    /// their outcome rather than make their own. The last attempt's error if none succeeds.
    async fn connect(&self) -> RedisResult<Arc<Link>> {
        let seen = self.attempts.load(Ordering::Acquire);
        let mut failed = self.connecting.lock().await;
        if let Some(link) = self.current() {
            return Ok(link);
        }
        if self.attempts.load(Ordering::Acquire) != seen
            && let Some(err) = &*failed
        {
            return Err(err.clone());
        }
        let mut delay = RETRY_DELAY;
        let mut attempt = 1;
        let outcome = loop {
            let opened = tokio::time::timeout(CONNECTION_TIMEOUT, self.open()).await;
            match opened.unwrap_or_else(|_| Err(io_error("connecting took too long"))) {
                Ok(link) => break Ok(link),
                Err(err) if attempt == CONNECT_ATTEMPTS => break Err(err),
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
            }
        };
        self.attempts.fetch_add(1, Ordering::Release);
        match outcome {
            Ok(link) => {
                *failed = None;
                *lock(&self.link) = Some(Arc::clone(&link));
                Ok(link)
            }
            Err(err) => {
                *failed = Some(err.clone());
                Err(err)
            }
        }
    }

    /// Connects, and authenticates and selects the database the URL names.
    async fn open(&self) -> RedisResult<Arc<Link>> {
        let link = match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let (read, write) = stream.into_split();
                Link::start(read, write)
            }
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(config_error("insecure TLS (#insecure) is not supported"));
                }
                let Some(tls) = &self.tls else {
                    return Err(config_error("no TLS configuration for a rediss:// address"));
                };
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|err| config_error(&format!("{host}: {err}")))?;
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
                let stream = connector.connect(name, stream).await?;
                let (read, write) = tokio::io::split(stream);
                Link::start(read, write)
            }
            ConnectionAddr::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let (read, write) = stream.into_split();
                Link::start(read, write)
            }
            other => return Err(config_error(&format!("unsupported address {other}"))),
        };
        let settings = self.info.redis_settings();
        let mut handshake = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = settings.username() {
                auth.arg(username);
            }
            handshake.push(auth.arg(password).clone());
        }
        if settings.db() != 0 {
            handshake.push(redis::cmd("SELECT").arg(settings.db()).clone());
        }
        for command in &handshake {
            let replied = link.send(|out| command.write_packed_command(out), 1, None)?;
            let reply = replied.await.unwrap_or_else(|_| Err(io_error("closed")));
            if let Err(err) = reply.and_then(Value::extract_error) {
                link.close(&err);
                return Err(err);
            }
        }
        Ok(link)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if let Some(link) = lock(&self.link).take() {
            link.close(&io_error("the connection was dropped"));
        }
    }
}

/// A command as the store sends it: packed straight into a connection's buffer on one
/// server, or made a redis-rs command for the Cluster client.
pub(super) trait Command {
    /// Appends the command, as RESP, to `out`.
    fn pack(&self, out: &mut Vec<u8>);

    /// The command as redis-rs takes it.
    fn into_cmd(self) -> Cmd;
}

impl Command for Cmd {
    fn pack(&self, out: &mut Vec<u8>) {
        self.write_packed_command(out);
    }

    fn into_cmd(self) -> Cmd {
        self
    }
}

/// Appends RESP's header of a command of `count` arguments to `out`.
pub(super) fn pack_count(out: &mut Vec<u8>, count: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(count).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends one argument, the bytes of `parts` one after another, to `out`.
pub(super) fn pack_arg(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let length: usize = parts.iter().map(|part| part.len()).sum();
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
    out.extend_from_slice(b"\r\n");
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(b"\r\n");
}

/// redis-rs's view of a [`Wire`], for the calls it makes itself.
#[derive(Clone)]
pub(super) struct Handle(Arc<Wire>);

impl redis::aio::ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(self.0.request(|out| cmd.write_packed_command(out), 1, None))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let packed = pipeline.get_packed_pipeline();
            let replies = offset + count;
            match self
                .0
                .request(|out| out.extend_from_slice(&packed), replies, None)
                .await?
            {
                Value::Array(mut values) if replies > 1 => Ok(values.split_off(offset)),
                value => Ok(vec![value].split_off(offset)),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.0.info.redis_settings().db()
    }
}

/// One established connection: its commands waiting to be written, and those written and
/// waiting for their replies, in order. Its writer and reader tasks hold it.
struct Link {
    outbox: Mutex<Outbox>,
    waiting: Mutex<Waiting>,
    /// Wakes the writer: commands to write, or the link closed.
    write: Notify,
    /// Wakes the reader: an earlier deadline to time, or the link closed.
    rearm: Notify,
    /// Commands sent whose replies have not come (timed out or not).
    in_flight: AtomicUsize,
    /// Set once, when the link fails or is dropped; every caller waiting has then had an error.
    closed: AtomicBool,
}

/// Commands queued for the writer's next write.
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    waiters: Vec<Waiter>,
    /// Whether the writer has been woken for these.
    scheduled: bool,
    /// Whether one was sent while none waited: the writer writes without yielding first.
    at_once: bool,
    closed: Option<RedisError>,
}

/// Commands written, oldest first, and the reader's timer.
#[derive(Default)]
struct Waiting {
    waiters: VecDeque<Waiter>,
    /// When the reader's timer fires: at or before the earliest deadline of a waiter still
    /// waiting, and the oldest command's [`RESPONSE_TIMEOUT`].
    armed: Option<Instant>,
    closed: Option<RedisError>,
}

/// A command's caller, until its replies have come.
struct Waiter {
    /// Taken when answered (or timed out: the command's reply is still read, and dropped).
    reply: Option<oneshot::Sender<RedisResult<Value>>>,
    /// Replies the command (or pipeline) has, and those read so far.
    replies: usize,
    values: Vec<Value>,
    deadline: Option<Deadline>,
    /// When it was written.
    sent: Option<Instant>,
}

impl Link {
    /// A link over the two halves of a connected stream, its writer and reader running.
    fn start<R, W>(read: R, write: W) -> Arc<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let link = Arc::new(Self {
            outbox: Mutex::default(),
            waiting: Mutex::default(),
            write: Notify::new(),
            rearm: Notify::new(),
            in_flight: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(writer(Closing(Arc::clone(&link)), write));
        tokio::spawn(reader(Closing(Arc::clone(&link)), read));
        link
    }

    /// Queues what `write` packs for the writer; where its reply will come. An error if the
    /// link has closed.
    fn send(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
        replies: usize,
        deadline: Option<Deadline>,
    ) -> RedisResult<oneshot::Receiver<RedisResult<Value>>> {
        let (reply, replied) = oneshot::channel();
        let alone = self.in_flight.fetch_add(1, Ordering::Relaxed) == 0;
        let wake = {
            let mut outbox = lock(&self.outbox);
            if let Some(err) = &outbox.closed {
                return Err(err.clone());
            }
            write(&mut outbox.bytes);
            outbox.waiters.push(Waiter {
                reply: Some(reply),
                replies,
                values: Vec::new(),
                deadline,
                sent: None,
            });
            outbox.at_once |= alone;
            !std::mem::replace(&mut outbox.scheduled, true)
        };
        if wake {
            self.write.notify_one();
        }
        Ok(replied)
    }

    /// Moves written commands' callers to wait for their replies (before their bytes go out,
    /// so that no reply comes first), arming the reader's timer earlier if they need it.
    fn written(&self, waiters: Vec<Waiter>) {
        let now = Instant::now();
        let mut waiting = lock(&self.waiting);
        if let Some(err) = &waiting.closed {
            let err = err.clone();
            drop(waiting);
            for waiter in waiters {
                waiter.fail(&err);
            }
            return;
        }
        let mut earliest = waiting.waiters.is_empty().then_some(now + RESPONSE_TIMEOUT);
        for mut waiter in waiters {
            waiter.sent = Some(now);
            earliest = earliest.min_some(waiter.deadline);
            waiting.waiters.push_back(waiter);
        }
        if let Some(earliest) = earliest
            && waiting.armed.is_none_or(|armed| earliest < armed)
        {
            waiting.armed = Some(earliest);
            drop(waiting);
            self.rearm.notify_one();
        }
    }

    /// Hands each of `values` (complete replies, in order) to its waiter. An error if a reply
    /// came that no command waits for.
    fn answer(&self, values: &mut Vec<Value>) -> RedisResult<()> {
        let mut waiting = lock(&self.waiting);
        for value in values.drain(..) {
            let Some(waiter) = waiting.waiters.front_mut() else {
                return Err(protocol_error("a reply that no command waits for"));
            };
            let value = match waiter.replies {
                1 => value,
                _ => {
                    waiter.values.push(value);
                    if waiter.values.len() < waiter.replies {
                        continue;
                    }
                    Value::Array(std::mem::take(&mut waiter.values))
                }
            };
            let waiter = waiting.waiters.pop_front().expect("the front was there");
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let Some(reply) = waiter.reply {
                // A caller that stopped waiting dropped its receiver: nothing to tell.
                let _ = reply.send(Ok(value));
            }
        }
        Ok(())
    }

    /// Fires the reader's timer: callers whose deadline passed get a timeout error; a link
    /// whose oldest command waited [`RESPONSE_TIMEOUT`] closes. Arms the timer again.
    fn expire(&self, now: Instant) {
        let mut waiting = lock(&self.waiting);
        if waiting
            .waiters
            .front()
            .and_then(|oldest| oldest.sent)
            .is_some_and(|sent| sent + RESPONSE_TIMEOUT <= now)
        {
            drop(waiting);
            self.close(&io_error("no reply from Redis within the response timeout"));
            return;
        }
        let mut earliest = waiting
            .waiters
            .front()
            .and_then(|oldest| oldest.sent)
            .map(|sent| sent + RESPONSE_TIMEOUT);
        for waiter in &mut waiting.waiters {
            match waiter.deadline {
                Some(deadline) if deadline <= now => {
                    if let Some(reply) = waiter.reply.take() {
                        let _ = reply.send(Err(passed()));
                    }
                }
                deadline if waiter.reply.is_some() => earliest = earliest.min_some(deadline),
                _ => {}
            }
        }
        waiting.armed = earliest;
    }

    /// Closes the link: every caller waiting or queued gets `err`, its tasks stop, and the
    /// next command connects again. Later calls do nothing.
    fn close(&self, err: &RedisError) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let queued = {
            let mut outbox = lock(&self.outbox);
            outbox.closed = Some(err.clone());
            std::mem::take(&mut outbox.waiters)
        };
        let written = {
            let mut waiting = lock(&self.waiting);
            waiting.closed = Some(err.clone());
            std::mem::take(&mut waiting.waiters)
        };
        for waiter in queued.into_iter().chain(written) {
            waiter.fail(err);
        }
        self.write.notify_one();
        self.rearm.notify_one();
    }
}

impl Waiter {
    fn fail(self, err: &RedisError) {
        if let Some(reply) = self.reply {
            let _ = reply.send(Err(err.clone()));
        }
    }
}

/// A task's hold on its link: dropped, by the task's end or with its runtime, it closes the
/// link, so that no caller waits for a task that is gone.
struct Closing(Arc<Link>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(&io_error("the connection's tasks stopped"));
    }
}

/// Writes the link's queued commands, all that were queued in one pass of the scheduler in
/// one write, until the link closes.
async fn writer<W: AsyncWrite + Unpin>(link: Closing, mut stream: W) {
    let link = &link.0;
    let mut spare = Vec::new();
    loop {
        link.write.notified().await;
        if link.closed.load(Ordering::Acquire) {
            return;
        }
        if !lock(&link.outbox).at_once {
            BackOfTheQueue(false).await;
        }
        let (bytes, waiters) = {
            let mut outbox = lock(&link.outbox);
            outbox.scheduled = false;
            outbox.at_once = false;
            let bytes = std::mem::replace(&mut outbox.bytes, std::mem::take(&mut spare));
            (bytes, std::mem::take(&mut outbox.waiters))
        };
        if waiters.is_empty() {
            spare = bytes;
            continue;
        }
        link.written(waiters);
        // Flushed: TLS may hold records back until then (a socket's flush does nothing).
        let wrote = match stream.write_all(&bytes).await {
            Ok(()) => stream.flush().await,
            Err(err) => Err(err),
        };
        if let Err(err) = wrote {
            link.close(&err.into());
            return;
        }
        spare = bytes;
        spare.clear();
    }
}

/// Reads replies and hands them out, and fires the timer of deadlines, until the link closes.
async fn reader<R: AsyncRead + Unpin>(link: Closing, mut stream: R) {
    let link = &link.0;
    let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
    // Where the first reply not yet parsed starts.
    let mut start = 0;
    let mut values = Vec::new();
    let never = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut timer = pin!(tokio::time::sleep_until(never));
    let mut timer_at = never;
    loop {
        let armed = {
            let waiting = lock(&link.waiting);
            if waiting.closed.is_some() {
                return;
            }
            waiting.armed.unwrap_or(never)
        };
        if armed != timer_at {
            timer.as_mut().reset(armed);
            timer_at = armed;
        }
        if start == buffer.len() {
            buffer.clear();
            start = 0;
        } else if buffer.capacity() - buffer.len() < 4096 {
            buffer.drain(..start);
            start = 0;
            buffer.reserve(16 * 1024);
        }
        tokio::select! {
            biased;
            read = stream.read_buf(&mut buffer) => {
                let outcome = match read {
                    Ok(0) => Err(io_error("Redis closed the connection")),
                    Ok(_) => parse_all(&buffer, &mut start, &mut values)
                        .and_then(|()| link.answer(&mut values)),
                    Err(err) => Err(err.into()),
                };
                if let Err(err) = outcome {
                    link.close(&err);
                    return;
                }
            }
            () = &mut timer => {
                // Fired, it stays ready until reset: the next pass resets it, to `never` if
                // nothing waits.
                let now = Instant::now();
                timer_at = now;
                link.expire(now);
            }
            () = link.rearm.notified() => {}
        }
    }
}

/// Parses every complete reply of `buffer` from `start` into `values`, moving `start` past
/// them.
fn parse_all(buffer: &[u8], start: &mut usize, values: &mut Vec<Value>) -> RedisResult<()> {
    while let Some((value, length)) = parse(&buffer[*start..], 0)? {
        values.push(value);
        *start += length;
    }
    Ok(())
}

/// The reply at the start of `bytes` and its length, or `None` while only part of it is
/// there.
fn parse(bytes: &[u8], depth: usize) -> RedisResult<Option<(Value, usize)>> {
    // Refused at its first byte: a server that is not Redis may never end a line.
    let Some(&kind) = bytes.first() else {
        return Ok(None);
    };
    if !b"+-:$*".contains(&kind) {
        return Err(protocol_error(
            "not a RESP2 reply: is the server at this address Redis?",
        ));
    }
    let Some(end) = bytes.windows(2).position(|pair| pair == b"\r\n") else {
        if bytes.len() > MAX_LINE {
            return Err(protocol_error(
                "a line longer than Redis sends: is the server at this address Redis?",
            ));
        }
        return Ok(None);
    };
    let line = &bytes[1..end];
    let next = end + 2;
    let value = match kind {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
        // Rare: redis-rs makes the error, with its kind, from text it can read (a server
        // may quote a command's binary arguments in it).
        b'-' => match std::str::from_utf8(line) {
            Ok(_) => redis::parse_redis_value(&bytes[..next])?,
            Err(_) => {
                let text = format!("-{}\r\n", String::from_utf8_lossy(line));
                redis::parse_redis_value(text.as_bytes())?
            }
        },
        b':' => Value::Int(number(line)?),
        b'$' => {
            let Ok(length) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            if length > MAX_BULK {
                return Err(protocol_error("a bulk string longer than Redis allows"));
            }
            let Some(tail) = bytes.get(next + length..next + length + 2) else {
                return Ok(None);
            };
            if tail != b"\r\n" {
                return Err(protocol_error("a bulk string not ended by CRLF"));
            }
            return Ok(Some((
                Value::BulkString(bytes[next..next + length].to_vec()),
                next + length + 2,
            )));
        }
        // b'*', the last kind there is.
        _ => {
            let Ok(count) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            if depth == MAX_DEPTH {
                return Err(protocol_error("a reply nested too deeply"));
            }
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = next;
            for _ in 0..count {
                let Some((item, length)) = parse(&bytes[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at += length;
            }
            return Ok(Some((Value::Array(items), at)));
        }
    };
    Ok(Some((value, next)))
}

/// A reply's decimal integer.
fn number(line: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| protocol_error("a reply's number is not a number"))
}

/// The earlier of two optional instants, either if only one is there.
trait MinSome: Sized {
    fn min_some(self, other: Self) -> Self;
}

impl MinSome for Option<Instant> {
    fn min_some(self, other: Self) -> Self {
        match (self, other) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Ready on its second poll. On its first it wakes its task, which Tokio then runs again after
/// every task already waiting to run (`tokio::task::yield_now` also waits for the I/O driver,
/// which on an idle runtime costs a poll of it per write).
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_error(message: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        message,
    ))
}

fn protocol_error(message: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "a malformed reply from Redis",
        message.to_string(),
    ))
}

fn config_error(message: &str) -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "Redis connection",
        message.to_string(),
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RESP2's encoding of `value`.
    fn encode(value: &Value, out: &mut Vec<u8>) {
        match value {
            Value::Nil => out.extend_from_slice(b"$-1\r\n"),
            Value::Okay => out.extend_from_slice(b"+OK\r\n"),
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::SimpleString(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::BulkString(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    encode(item, out);
                }
            }
            other => unreachable!("not generated: {other:?}"),
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            "[a-zA-Z0-9 ]{0,12}"
                .prop_filter("not OK", |s| s != "OK")
                .prop_map(Value::SimpleString),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::BulkString),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(Value::Array)
        })
    }

    proptest! {
        /// Replies split anywhere are read whole once their last byte is there, in order, and
        /// not before.
        #[test]
        fn replies_split_anywhere_are_read_whole(
            replies in proptest::collection::vec(value(), 1..5),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            for reply in &replies {
                encode(reply, &mut bytes);
            }
            let cut = cut.index(bytes.len() + 1);
            let (mut start, mut values) = (0, Vec::new());
            parse_all(&bytes[..cut], &mut start, &mut values).unwrap();
            let mut buffer = bytes[start..cut].to_vec();
            buffer.extend_from_slice(&bytes[cut..]);
            let mut rest_start = 0;
            parse_all(&buffer, &mut rest_start, &mut values).unwrap();
            prop_assert_eq!(rest_start, buffer.len());
            prop_assert_eq!(values, replies);
        }

        /// Whatever a server sends (valid replies with bytes changed, or any bytes at all) is
        /// read, waited on or refused: never a panic, and never a wait on bytes that cannot
        /// start a reply.
        #[test]
        fn any_bytes_are_read_or_refused(
            replies in proptest::collection::vec(value(), 1..4),
            changes in proptest::collection::vec(
                (any::<prop::sample::Index>(), any::<u8>()), 0..4),
            noise in proptest::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'*'), Just(b'$'), Just(b'-'),
                    Just(b'+'), Just(b':'), any::<u8>()], 0..64),
        ) {
            let mut bytes = Vec::new();
            for reply in &replies {
                encode(reply, &mut bytes);
            }
            for (at, byte) in changes {
                let at = at.index(bytes.len());
                bytes[at] = byte;
            }
            for input in [&bytes[..], &noise[..]] {
                let (mut start, mut values) = (0, Vec::new());
                if parse_all(input, &mut start, &mut values).is_ok() && start < input.len() {
                    prop_assert!(
                        b"+-:$*".contains(&input[start]),
                        "waits on {:?}",
                        String::from_utf8_lossy(&input[start..])
                    );
                }
            }
        }
    }

    /// A pipeline (redis-rs's `MULTI`...`EXEC`, through [`Handle`]) is one caller's: its
    /// replies come back together, as an array, and the next caller's reply is its own.
    #[tokio::test]
    async fn a_pipelines_replies_come_back_together() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (client, mut server) = tokio::io::duplex(1024);
        let (read, write) = tokio::io::split(client);
        let link = Link::start(read, write);
        let pipeline = link
            .send(|out| out.extend_from_slice(b"three commands"), 3, None)
            .unwrap();
        let single = link
            .send(|out| out.extend_from_slice(b"and one"), 1, None)
            .unwrap();
        let mut sent = vec![0; 21];
        server.read_exact(&mut sent).await.unwrap();
        assert_eq!(sent, b"three commandsand one");
        // The replies, split mid-way: the pipeline's waits for its third.
        server.write_all(b"+OK\r\n:1\r\n").await.unwrap();
        server.write_all(b"$1\r\nx\r\n:7\r\n").await.unwrap();
        let expected = Value::Array(vec![
            Value::Okay,
            Value::Int(1),
            Value::BulkString(b"x".to_vec()),
        ]);
        assert_eq!(pipeline.await.unwrap().unwrap(), expected);
        assert_eq!(single.await.unwrap().unwrap(), Value::Int(7));
        assert_eq!(link.in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_error_reply_is_a_server_error_of_its_kind() {
        let (value, length) = parse(b"-NOSCRIPT No matching script\r\n:1\r\n", 0)
            .unwrap()
            .unwrap();
        assert_eq!(length, 30);
        let err = value.extract_error().unwrap_err();
        assert_eq!(err.code(), Some("NOSCRIPT"));
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for bytes in [
            &b"?what\r\n"[..],
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*1\r\n!\r\n",
        ] {
            assert!(
                parse(bytes, 0).is_err(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes(), 0).is_err());
        assert_eq!(parse(b"$-1\r\n", 0).unwrap(), Some((Value::Nil, 5)));
        assert_eq!(parse(b"*-1\r\n", 0).unwrap(), Some((Value::Nil, 5)));
        assert_eq!(parse(b"$3\r\nab", 0).unwrap(), None);
        // Refused as soon as its first byte is there, not once a line ends.
        assert!(parse(b"H", 0).is_err());
        assert!(parse(b"\r\n", 0).is_err());
        // A line that never ends is refused past the longest line Redis sends.
        let endless = vec![b'+'; MAX_LINE + 2];
        assert!(parse(&endless, 0).is_err());
        assert_eq!(parse(&endless[..MAX_LINE], 0).unwrap(), None);
    }
}
