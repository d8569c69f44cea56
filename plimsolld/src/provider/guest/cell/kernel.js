// plimsoll's JavaScript cell kernel (providers.md §9.6), run by the launcher as
//
//   node --expose-internals -e <this file> <kernel dir>
//
// It listens on <dir>/ctl.sock, then writes its PID to <dir>/ready. Each connection carries one
// cell, {"nonce","code"} and a newline; cells run one at a time in arrival order. Around a cell
// it writes \0plimsoll-cell-start-<nonce>\0 and \0plimsoll-cell-end-<nonce>\0 to stdout and
// stderr (the relay forwards only what lies between them), then answers {"status":"ok"|"error"}
// and closes. State lives in this one global context: top-level let/const become var and
// `class X` becomes `var X = class X`, so later cells see (and may redeclare) them. Errors are
// printed, never fatal.
// Everything sits in one function, so cells see none of the kernel's names.
(function kernel() {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const path = require('path');
  const util = require('util');
  const vm = require('vm');
  const { createRequire } = require('module');

  const dir = process.argv[1];
  // The launcher preloads the runner guard (this process is now non-dumpable); the processes
  // cells start do not inherit it.
  if (process.env.LD_PRELOAD === '/usr/local/lib/plimsoll-runner-guard.so') {
    delete process.env.LD_PRELOAD;
  }
  const INSPECT = { depth: 4, maxArrayLength: 100, maxStringLength: 10000 };
  // How long a marker write may wait for the stream to drain (the code may have broken it).
  const FLUSH_MS = 1000;

  // Node's own parser and its top-level await rewrite (the REPL's) are loaded by the first cell
  // that may need them: loaded at start they hold about 2.5 MiB of every idle kernel (pool
  // members may stay idle until ended), and a cell without these words needs neither.
  const load = require;
  const NEEDS_PARSER = /\b(?:let|const|class|await)\b/;
  let acorn = null;
  let topLevelAwait = null;
  let loaded = false;
  function loadParser() {
    if (loaded) return;
    loaded = true;
    try {
      acorn = load('internal/deps/acorn/acorn/dist/acorn');
      ({ processTopLevelAwait: topLevelAwait } = load('internal/repl/await'));
    } catch {
      // Without the internals cells run unrewritten.
      acorn = null;
      topLevelAwait = null;
    }
  }

  globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));
  delete globalThis.module;
  delete globalThis.exports;

  // Top-level `let`/`const` to `var`, `class X {}` to `var X = class X {};`, so names persist and
  // may be declared again by a later cell.
  function rewrite(code) {
    if (acorn === null) return code;
    let tree;
    try {
      tree = acorn.parse(code, {
        ecmaVersion: 'latest',
        sourceType: 'script',
        allowAwaitOutsideFunction: true,
        allowHashBang: true,
      });
    } catch {
      return code; // the engine reports the syntax error with its own message
    }
    const edits = [];
    for (const node of tree.body) {
      if (node.type === 'VariableDeclaration' && (node.kind === 'let' || node.kind === 'const')) {
        edits.push([node.start, node.start + node.kind.length, 'var']);
      } else if (node.type === 'ClassDeclaration' && node.id) {
        edits.push([node.end, node.end, ';']);
        edits.push([node.start, node.start, `var ${node.id.name} = `]);
      }
    }
    edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
    let out = code;
    for (const [from, to, text] of edits) out = out.slice(0, from) + text + out.slice(to);
    return out;
  }

  function report(error) {
    let text;
    try {
      text = error instanceof Error && error.stack ? error.stack : `Uncaught ${util.inspect(error, INSPECT)}`;
    } catch {
      text = 'Uncaught exception';
    }
    try {
      process.stderr.write(`${text}\n`);
    } catch {
      // stderr is the code's to break
    }
  }

  process.on('uncaughtException', report);
  process.on('unhandledRejection', report);

  // Writes `text` to a stream and resolves once it left, or after FLUSH_MS.
  function put(stream, text) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, FLUSH_MS);
      try {
        stream.write(text, () => {
          clearTimeout(timer);
          resolve();
        });
      } catch {
        clearTimeout(timer);
        resolve();
      }
    });
  }

  let cellNumber = 0;

  async function runCell(code) {
    cellNumber += 1;
    const filename = `cell${cellNumber}.js`;
    let source = code;
    let awaited = false;
    if (NEEDS_PARSER.test(code)) loadParser();
    if (topLevelAwait !== null) {
      try {
        const wrapped = topLevelAwait(code);
        if (wrapped !== null) {
          source = wrapped;
          awaited = true;
        }
      } catch {
        // not parseable as a top-level-await cell: run it as written
      }
    }
    source = rewrite(source);
    let value = vm.runInThisContext(source, { filename, displayErrors: false });
    if (awaited) {
      const result = await value;
      value = result === undefined ? undefined : result.value;
    }
    if (value !== undefined) {
      globalThis._ = value;
      await put(process.stdout, `${util.inspect(value, INSPECT)}\n`);
    }
  }

  // A cell may close fd 0, 1 or 2; the next socket would then take that number and the markers
  // would land in it. Reopen what is missing (the FIFOs, so output still flows): an open takes
  // the lowest free number, so filling them in ascending order puts each where it belongs.
  function plugStandardFds() {
    const targets = [[0, '/dev/null'], [1, path.join(dir, 'out')], [2, path.join(dir, 'err')]];
    for (const [fd, file] of targets) {
      try {
        fs.fstatSync(fd);
        continue;
      } catch {
        // closed: reopen below
      }
      try {
        const opened = fs.openSync(file, fs.constants.O_RDWR);
        if (opened !== fd) fs.closeSync(opened);
      } catch {
        // nothing better to do; the relay's grace period still ends the next cell
      }
    }
  }

  const queue = [];
  let busy = false;

  async function drain() {
    if (busy) return;
    busy = true;
    while (queue.length > 0) {
      const { socket, nonce, code } = queue.shift();
      const start = `\0plimsoll-cell-start-${nonce}\0`;
      const end = `\0plimsoll-cell-end-${nonce}\0`;
      await Promise.all([put(process.stdout, start), put(process.stderr, start)]);
      let status = 'ok';
      try {
        await runCell(code);
      } catch (error) {
        status = 'error';
        report(error);
      }
      await Promise.all([put(process.stdout, end), put(process.stderr, end)]);
      socket.end(`${JSON.stringify({ status })}\n`);
      plugStandardFds();
    }
    busy = false;
  }

  const server = net.createServer((socket) => {
    let buffered = '';
    let taken = false;
    socket.setEncoding('utf8');
    socket.on('error', () => {});
    socket.on('data', (chunk) => {
      if (taken) return;
      buffered += chunk;
      const newline = buffered.indexOf('\n');
      if (newline < 0) return;
      taken = true;
      let cell;
      try {
        cell = JSON.parse(buffered.slice(0, newline));
      } catch {
        socket.destroy();
        return;
      }
      if (typeof cell.nonce !== 'string' || !/^[0-9a-f]{32}$/.test(cell.nonce) || typeof cell.code !== 'string') {
        socket.destroy();
        return;
      }
      queue.push({ socket, nonce: cell.nonce, code: cell.code });
      drain();
    });
  });

  server.listen(path.join(dir, 'ctl.sock'), () => {
    const ready = path.join(dir, 'ready');
    fs.writeFileSync(`${ready}.tmp`, String(process.pid));
    fs.renameSync(`${ready}.tmp`, ready);
  });
})();
