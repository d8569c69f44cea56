// plimsoll's cell relay (providers.md §9.6), one per language, started over `docker exec` under
// the runner guard (non-dumpable, so no session process can read or steer it) as
//
//   node -e <this file> <kernel dir> <work dir>
//
// The daemon holds its stdin and stdout: one JSON object per line each way. Its first line is
// {"ready":"pid:starttime:cmdlinehex"}. Per cell, every frame it writes carries the cell's nonce
// as "n":
//   prepare  {"nonce","files":[{path,content}]} -> {"n","prepared":true}
//            | {"n","done":3,"file":i,"errno":"E…"} (a file could not be written: nothing ran)
//            | {"n","done":75} (no interpreter listening: nothing ran)
//   run      {"nonce","code","outCap","errCap"} -> {"n","o":b64} / {"n","e":b64} pieces of at
//            most 48 KiB, then {"n","done":0|1|76,"ot","et"} (ran / raised / interpreter gone)
// It reads the kernel's stdout and stderr FIFOs for its whole life and forwards only the bytes
// between the current cell's start and end markers; anything written between cells is dropped.
// Any message it cannot accept ends the relay (the daemon then treats the interpreter as lost).
(function relay() {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const path = require('path');

  const [dir, work] = process.argv.slice(1);
  const PIECE = 48 * 1024;
  // After the status, how long to wait for end markers the code may have made impossible.
  const MARKER_GRACE_MS = 2000;
  // After the interpreter hung up without a status, how long the FIFOs may still deliver.
  const GONE_GRACE_MS = 200;
  const NONCE = /^[0-9a-f]{32}$/;

  function send(frame) {
    process.stdout.write(`${JSON.stringify(frame)}\n`);
  }

  function fail(why) {
    process.stderr.write(`relay: ${why}\n`);
    process.exit(2);
  }

  function identity() {
    const stat = fs.readFileSync('/proc/self/stat', 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    let cmdline = fs.readFileSync('/proc/self/cmdline');
    if (cmdline.length > 0 && cmdline[cmdline.length - 1] === 0) cmdline = cmdline.subarray(0, cmdline.length - 1);
    return `${process.pid}:${fields[19]}:${cmdline.toString('hex')}`;
  }

  // === files ===

  function inside(real) {
    return real === work || real.startsWith(`${work}/`);
  }

  // Creates the parent directories of `rel` under /work without following any link.
  function makeParents(rel) {
    let at = work;
    const parts = rel.split('/').slice(0, -1);
    for (const part of parts) {
      at = path.join(at, part);
      let st = null;
      try {
        st = fs.lstatSync(at);
      } catch (e) {
        if (e.code !== 'ENOENT') throw e;
      }
      if (st === null) {
        fs.mkdirSync(at, 0o755);
      } else if (!st.isDirectory()) {
        const e = new Error(`${at} is not a directory`);
        e.code = st.isSymbolicLink() ? 'ELOOP' : 'ENOTDIR';
        throw e;
      }
    }
    return at;
  }

  function writeFile(file) {
    const rel = file.path;
    if (typeof rel !== 'string' || typeof file.content !== 'string' || rel === '' || rel.includes('\0')) {
      throw Object.assign(new Error('bad file'), { code: 'EINVAL' });
    }
    const dest = path.resolve(work, rel);
    if (!inside(dest) || dest === work || path.isAbsolute(rel)) {
      throw Object.assign(new Error('outside /work'), { code: 'EPERM' });
    }
    const parent = makeParents(path.relative(work, dest));
    if (!inside(fs.realpathSync(parent))) {
      throw Object.assign(new Error('parent outside /work'), { code: 'EPERM' });
    }
    const c = fs.constants;
    const fd = fs.openSync(dest, c.O_WRONLY | c.O_CREAT | c.O_NOFOLLOW | c.O_NONBLOCK, 0o644);
    try {
      if (!fs.fstatSync(fd).isFile()) throw Object.assign(new Error('not a regular file'), { code: 'EINVAL' });
      const opened = fs.readlinkSync(`/proc/self/fd/${fd}`);
      if (!inside(opened)) throw Object.assign(new Error('opened outside /work'), { code: 'EPERM' });
      fs.ftruncateSync(fd, 0);
      fs.writeSync(fd, Buffer.from(file.content, 'utf8'));
    } finally {
      fs.closeSync(fd);
    }
  }

  // === the current cell ===

  let cell = null;

  function streamState(cap) {
    return { started: false, ended: false, pending: Buffer.alloc(0), sent: 0, cap, truncated: false };
  }

  // Sends what fits under the stream's cap, in pieces; the rest only sets the flag.
  function forward(key, s, bytes) {
    const room = Math.max(0, s.cap - s.sent);
    if (bytes.length > room) s.truncated = true;
    let keep = bytes.subarray(0, Math.min(bytes.length, room));
    s.sent += keep.length;
    while (keep.length > 0) {
      send({ n: cell.nonce, [key]: keep.subarray(0, PIECE).toString('base64') });
      keep = keep.subarray(PIECE);
    }
  }

  // Feeds bytes read from one FIFO through the current cell's markers.
  function feed(key, chunk) {
    if (cell === null || cell.code === false) return; // between cells: drained and dropped
    const s = cell[key];
    if (s.ended) return;
    let buf = Buffer.concat([s.pending, chunk]);
    if (!s.started) {
      const at = buf.indexOf(cell.start);
      if (at < 0) {
        s.pending = buf.subarray(Math.max(0, buf.length - (cell.start.length - 1)));
        return;
      }
      s.started = true;
      buf = buf.subarray(at + cell.start.length);
    }
    const at = buf.indexOf(cell.end);
    if (at >= 0) {
      forward(key, s, buf.subarray(0, at));
      s.pending = Buffer.alloc(0);
      s.ended = true;
      settle();
      return;
    }
    const hold = markerPrefix(buf, cell.end);
    forward(key, s, buf.subarray(0, buf.length - hold));
    s.pending = buf.subarray(buf.length - hold);
  }

  // The length of the longest tail of `buf` that could begin `marker`: only those bytes wait
  // for the next read, so output reaches the daemon as soon as it is written.
  function markerPrefix(buf, marker) {
    for (let k = Math.min(buf.length, marker.length - 1); k > 0; k -= 1) {
      if (buf.subarray(buf.length - k).equals(marker.subarray(0, k))) return k;
    }
    return 0;
  }

  function finish(done) {
    const c = cell;
    if (c === null) return;
    for (const key of ['o', 'e']) {
      const s = c[key];
      if (s.started && !s.ended && s.pending.length > 0) forward(key, s, s.pending);
    }
    clearTimeout(c.timer);
    cell = null;
    send({ n: c.nonce, done, ot: c.o.truncated, et: c.e.truncated });
    try {
      c.socket.destroy();
    } catch {
      // already closed
    }
  }

  function settle() {
    if (cell === null || cell.status === null) return;
    if (cell.o.ended && cell.e.ended) finish(cell.status === 'ok' ? 0 : 1);
  }

  // === FIFOs ===

  function openFifo(name, key) {
    // Read-write: the open never blocks and the read never sees end-of-file between
    // interpreters.
    const fd = fs.openSync(path.join(dir, name), fs.constants.O_RDWR | fs.constants.O_NONBLOCK);
    const stream = new net.Socket({ fd, readable: true, writable: false });
    stream.on('data', (chunk) => feed(key, chunk));
    stream.on('error', (e) => fail(`${name}: ${e.message}`));
  }

  // === the daemon's messages ===

  function prepare(msg) {
    if (cell !== null) fail('prepare during a cell');
    if (typeof msg.nonce !== 'string' || !NONCE.test(msg.nonce) || !Array.isArray(msg.files)) fail('bad prepare');
    const nonce = msg.nonce;
    for (let i = 0; i < msg.files.length; i += 1) {
      try {
        writeFile(msg.files[i]);
      } catch (e) {
        send({ n: nonce, done: 3, file: i, errno: typeof e.code === 'string' ? e.code : 'EIO' });
        return;
      }
    }
    const socket = net.connect(path.join(dir, 'ctl.sock'));
    cell = {
      nonce,
      socket,
      code: false,
      status: null,
      timer: null,
      start: Buffer.from(`\0plimsoll-cell-start-${nonce}\0`),
      end: Buffer.from(`\0plimsoll-cell-end-${nonce}\0`),
      o: streamState(0),
      e: streamState(0),
    };
    const c = cell;
    let reply = '';
    socket.setEncoding('utf8');
    socket.on('connect', () => {
      if (cell === c) send({ n: nonce, prepared: true });
    });
    socket.on('data', (chunk) => {
      reply += chunk;
      const newline = reply.indexOf('\n');
      if (newline < 0 || cell !== c || c.status !== null) return;
      let status = null;
      try {
        status = JSON.parse(reply.slice(0, newline)).status;
      } catch {
        status = null;
      }
      if (status !== 'ok' && status !== 'error') return;
      c.status = status;
      c.timer = setTimeout(() => {
        if (cell === c) finish(status === 'ok' ? 0 : 1);
      }, MARKER_GRACE_MS);
      settle();
    });
    const gone = () => {
      if (cell !== c) return;
      if (!c.code) {
        cell = null;
        send({ n: nonce, done: 75 });
      } else if (c.status === null) {
        c.status = 'gone';
        setTimeout(() => {
          if (cell === c) finish(76);
        }, GONE_GRACE_MS);
      }
    };
    socket.on('error', gone);
    socket.on('close', gone);
  }

  function run(msg) {
    if (cell === null || cell.code !== false || msg.nonce !== cell.nonce) fail('run without its prepare');
    if (typeof msg.code !== 'string' || !Number.isSafeInteger(msg.outCap) || !Number.isSafeInteger(msg.errCap)) fail('bad run');
    cell.code = true;
    cell.o = streamState(Math.max(0, msg.outCap));
    cell.e = streamState(Math.max(0, msg.errCap));
    cell.socket.write(`${JSON.stringify({ nonce: cell.nonce, code: msg.code })}\n`);
  }

  let input = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    input += chunk;
    let newline;
    while ((newline = input.indexOf('\n')) >= 0) {
      const line = input.slice(0, newline);
      input = input.slice(newline + 1);
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        fail('a line that is not JSON');
      }
      if (msg === null || typeof msg !== 'object') fail('a message that is not an object');
      if ('files' in msg) prepare(msg);
      else if ('code' in msg) run(msg);
      else fail('an unknown message');
    }
  });
  process.stdin.on('end', () => process.exit(0));

  openFifo('out', 'o');
  openFifo('err', 'e');
  send({ ready: identity() });
})();
