// Fake streaming providers on 127.0.0.1 (a real node:http server on an
// ephemeral port), the same server as python/tests/sse_loopback.py: three
// provider dialects over text/event-stream, in the wire format the official
// SDKs parse. The first path segment names the route; the rest picks the dialect:
//
//   POST /{route}/chat/completions      OpenAI chat completions (data: chunk ... data: [DONE])
//   POST /{route}/responses             OpenAI Responses (event: <type> / data: <json>,
//                                       sequence_number 0, 1, ... up to response.completed)
//   GET  /{route}/responses/{id}?stream=true&starting_after=N
//                                       that response's events with a sequence number above N
//   POST /{route}/v1/messages           Anthropic messages (message_start ... message_stop)
//
// so an SDK client takes `baseURL: server.url(route)` for OpenAI and Anthropic.
//
// Each route answers its script in order; the last reply repeats. A reply
// (every key optional) is e.g. `{ text: "Hello world from the primary", chunks: 5 }`:
// the text in `chunks` content deltas, the "content-bearing events" that N
// counts below (a fault with N = 0 fires before the first delta, one with N at
// or above the number of deltas after the last one). Faults:
//
//   cutAfter: N               N deltas, then the socket is destroyed mid chunked body
//                             (cutReset: true sends a TCP reset instead of a FIN)
//   stallAfter: N, stallS: s  N deltas, a pause of s seconds, then the rest
//   errorAfter: N             N deltas, the dialect's error event, a clean end
//   endAfter: N               N deltas, then a clean end of the body
//   noTerminal: true          all but the terminal event ([DONE], response.completed, message_stop)
//   malformedAfter: N         N deltas, a frame whose data is not JSON, then the rest
//   oversizeAfter: N, oversizeBytes: K
//                             one more delta of K bytes after the N-th (part of the text)
//   sequenceBackAfter: N      (Responses) the event after the N-th delta carries a
//                             sequence number one below its predecessor's
//   status: 429 (500, 529...) a plain JSON error in the dialect's shape, with `headers`
//
// Other keys: headers, model, id (default resp_{route}_{n}, msg_{route}_{n},
// chatcmpl-{route}_{n} for the route's n-th request), inputTokens, ping
// (Anthropic, default true), errorCode, errorMessage, toolCall: {name, arguments}
// (a non-streamed answer that calls that tool with those arguments instead of text). The snake_case names of
// the Python server are accepted too. A Responses resume (the GET) takes the
// route's next reply, but only its faults and status: the events replayed are
// those of the stored response. A request without `"stream": true` gets the
// final object as plain JSON.
import http from "node:http";

/**
 * @typedef {{
 *   text?: string, chunks?: number, model?: string, id?: string, inputTokens?: number, ping?: boolean,
 *   status?: number, headers?: Record<string, string>, errorCode?: string, errorMessage?: string,
 *   cutAfter?: number, cutReset?: boolean, stallAfter?: number, stallS?: number, errorAfter?: number,
 *   endAfter?: number, noTerminal?: boolean, malformedAfter?: number, oversizeAfter?: number,
 *   oversizeBytes?: number, sequenceBackAfter?: number, [key: string]: unknown
 * }} StreamReply
 * @typedef {{route: string, method: string, path: string, query: Record<string, string>, idempotencyKey: string | undefined, arrivedAt: number, body: any}} StreamRequest
 * @typedef {{name: string | null, data: any, delta: boolean}} SSEEvent
 * @typedef {{dialect: "chat" | "responses" | "anthropic", events: SSEEvent[], final: Record<string, any>}} Made
 */

export const DEFAULT_TEXT = "Hello world from the primary";
const CREATED = 1_700_000_000;

/** Faults that fire at a count of deltas, in the order they fire at the same count. */
const FAULTS = /** @type {const} */ (["sequenceBackAfter", "malformedAfter", "stallAfter", "errorAfter", "endAfter", "cutAfter"]);

/** snake_case keys of a reply as camelCase. @param {Record<string, unknown>} reply @returns {StreamReply} */
function camel(reply) {
  /** @type {Record<string, unknown>} */
  const out = {};
  for (const [key, value] of Object.entries(reply)) out[key.replace(/_([a-z])/g, (_, c) => c.toUpperCase())] = value;
  return out;
}

/**
 * `text` in `chunks` nonempty pieces (fewer if it is shorter), split at spaces when it can.
 * @param {string} text @param {number} chunks
 */
export function splitText(text, chunks) {
  if (text === "") return [];
  const n = Math.max(1, Math.min(chunks, text.length));
  const words = text.split(" ");
  /** @type {string[]} */
  const pieces = [];
  if (words.length >= n) {
    const per = Math.floor(words.length / n);
    const extra = words.length % n;
    let start = 0;
    for (let i = 0; i < n; i += 1) {
      const end = start + per + (i < extra ? 1 : 0);
      pieces.push((i ? " " : "") + words.slice(start, end).join(" "));
      start = end;
    }
    return pieces;
  }
  const per = Math.floor(text.length / n);
  const extra = text.length % n;
  let start = 0;
  for (let i = 0; i < n; i += 1) {
    const end = start + per + (i < extra ? 1 : 0);
    pieces.push(text.slice(start, end));
    start = end;
  }
  return pieces;
}

/** @param {StreamReply} reply */
function piecesOf(reply) {
  const pieces = splitText(String(reply.text ?? DEFAULT_TEXT), Number(reply.chunks ?? 5));
  if (reply.oversizeAfter !== undefined) {
    pieces.splice(Math.min(reply.oversizeAfter, pieces.length), 0, "x".repeat(reply.oversizeBytes ?? 1 << 20));
  }
  return pieces;
}

/** The JSON error document a provider sends with `status`. @param {string} dialect @param {number} status @param {StreamReply} reply */
export function errorBody(dialect, status, reply) {
  const message = reply.errorMessage || `fake ${status}`;
  if (dialect === "anthropic") {
    /** @type {Record<number, string>} */
    const kinds = { 400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error" };
    return { type: "error", error: { type: reply.errorCode || kinds[status] || "api_error", message } };
  }
  /** @type {Record<number, string>} */
  const kinds = { 429: "rate_limit_exceeded", 400: "invalid_request_error", 404: "not_found" };
  const kind = kinds[status] ?? "server_error";
  return { error: { message, type: kind, param: null, code: reply.errorCode || kind } };
}

/** @param {string | null} name @param {any} data @param {boolean} [delta] @returns {SSEEvent} */
const ev = (name, data, delta = false) => ({ name, data, delta });

/** @param {SSEEvent} event @param {number | null} seq */
function frame(event, seq) {
  let data = event.data;
  if (seq !== null && typeof data === "object" && data !== null) data = { ...data, sequence_number: seq };
  const text = typeof data === "string" ? data : JSON.stringify(data);
  return `${event.name === null ? "" : `event: ${event.name}\n`}data: ${text}\n\n`;
}

/** @param {StreamReply} reply @param {string} id @param {Record<string, any>} request @returns {Made} */
function chatScript(reply, id, request) {
  const model = String(reply.model || request.model || "gpt-fake");
  const pieces = piecesOf(reply);
  const text = pieces.join("");
  const usageWanted = Boolean(request.stream_options?.include_usage);
  const prompt = Number(reply.inputTokens ?? 12);
  const usage = { prompt_tokens: prompt, completion_tokens: pieces.length, total_tokens: prompt + pieces.length };
  const head = { id, object: "chat.completion.chunk", created: CREATED, model, system_fingerprint: "fp_fake" };
  /** @param {object} delta @param {string | null} [finish] */
  const chunk = (delta, finish = null) => ({ ...head, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...(usageWanted ? { usage: null } : {}) });
  const events = [ev(null, chunk({ role: "assistant", content: "", refusal: null })), ...pieces.map((p) => ev(null, chunk({ content: p }), true)), ev(null, chunk({}, "stop"))];
  if (usageWanted) events.push(ev(null, { ...head, choices: [], usage }));
  events.push(ev(null, "[DONE]"));
  const final = {
    id,
    object: "chat.completion",
    created: CREATED,
    model,
    system_fingerprint: "fp_fake",
    choices: [{ index: 0, message: { role: "assistant", content: text, refusal: null }, logprobs: null, finish_reason: "stop" }],
    usage,
  };
  if (reply.toolCall !== undefined) {
    const call = /** @type {{name: string, arguments: unknown}} */ (reply.toolCall);
    const tool_calls = [{ id: `call_${id}`, type: "function", function: { name: call.name, arguments: JSON.stringify(call.arguments) } }];
    final.choices = [{ index: 0, message: /** @type {any} */ ({ role: "assistant", content: null, refusal: null, tool_calls }), logprobs: null, finish_reason: "tool_calls" }];
  }
  return { dialect: "chat", events, final };
}

/** @param {StreamReply} reply @param {string} id @param {Record<string, any>} request @returns {Made} */
function responsesScript(reply, id, request) {
  const model = String(reply.model || request.model || "gpt-fake");
  const pieces = piecesOf(reply);
  const text = pieces.join("");
  const itemId = `msg_${id.replace(/^resp_/, "")}`;
  const prompt = Number(reply.inputTokens ?? 12);
  const usage = {
    input_tokens: prompt,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: pieces.length,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: prompt + pieces.length,
  };
  /** @param {string} status @param {unknown[]} output @param {boolean} withUsage */
  const response = (status, output, withUsage) => ({
    id,
    object: "response",
    created_at: CREATED,
    status,
    background: Boolean(request.background ?? false),
    error: null,
    incomplete_details: null,
    instructions: request.instructions ?? null,
    max_output_tokens: null,
    model,
    output,
    parallel_tool_calls: true,
    previous_response_id: null,
    reasoning: { effort: null, summary: null },
    store: true,
    temperature: 1.0,
    text: { format: { type: "text" } },
    tool_choice: "auto",
    tools: [],
    top_p: 1.0,
    truncation: "disabled",
    usage: withUsage ? usage : null,
    user: null,
    metadata: {},
  });
  /** @param {string} t */
  const part = (t) => ({ type: "output_text", annotations: [], logprobs: [], text: t });
  /** @param {string} status @param {unknown[]} content */
  const item = (status, content) => ({ id: itemId, type: "message", status, role: "assistant", content });
  const at = { item_id: itemId, output_index: 0, content_index: 0 };
  const doneItem = item("completed", [part(text)]);
  /** @type {[string, object, boolean][]} */
  const raw = [
    ["response.created", { response: response("in_progress", [], false) }, false],
    ["response.in_progress", { response: response("in_progress", [], false) }, false],
    ["response.output_item.added", { output_index: 0, item: item("in_progress", []) }, false],
    ["response.content_part.added", { ...at, part: part("") }, false],
    ...pieces.map((p) => /** @type {[string, object, boolean]} */ (["response.output_text.delta", { ...at, delta: p, logprobs: [] }, true])),
    ["response.output_text.done", { ...at, text, logprobs: [] }, false],
    ["response.content_part.done", { ...at, part: part(text) }, false],
    ["response.output_item.done", { output_index: 0, item: doneItem }, false],
    ["response.completed", { response: response("completed", [doneItem], true) }, false],
  ];
  const events = raw.map(([name, data, delta], seq) => ev(name, { type: name, ...data, sequence_number: seq }, delta));
  return { dialect: "responses", events, final: response("completed", [doneItem], true) };
}

/** @param {StreamReply} reply @param {string} id @param {Record<string, any>} request @returns {Made} */
function anthropicScript(reply, id, request) {
  const model = String(reply.model || request.model || "claude-fake");
  const pieces = piecesOf(reply);
  const text = pieces.join("");
  const startUsage = { input_tokens: Number(reply.inputTokens ?? 12), cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 1 };
  const message = { id, type: "message", role: "assistant", model, content: [], stop_reason: null, stop_sequence: null, usage: startUsage };
  const events = [ev("message_start", { type: "message_start", message })];
  if (reply.ping ?? true) events.push(ev("ping", { type: "ping" }));
  events.push(ev("content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }));
  for (const p of pieces) events.push(ev("content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: p } }, true));
  events.push(
    ev("content_block_stop", { type: "content_block_stop", index: 0 }),
    ev("message_delta", { type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: pieces.length } }),
    ev("message_stop", { type: "message_stop" }),
  );
  /** @type {Record<string, any>} */
  const final = { ...message, content: [{ type: "text", text }], stop_reason: "end_turn", usage: { ...startUsage, output_tokens: pieces.length } };
  if (reply.toolCall !== undefined) {
    const call = /** @type {{name: string, arguments: unknown}} */ (reply.toolCall);
    final.content = [{ type: "tool_use", id: `toolu_${id}`, name: call.name, input: call.arguments }];
    final.stop_reason = "tool_use";
  }
  return { dialect: "anthropic", events, final };
}

/** @param {Made["dialect"]} dialect @param {StreamReply} reply @param {number} seq */
function errorEvent(dialect, reply, seq) {
  const message = reply.errorMessage || "fake stream error";
  if (dialect === "chat") return ev(null, { error: { message, type: "server_error", param: null, code: reply.errorCode || "server_error" } });
  if (dialect === "responses") return ev("error", { type: "error", code: reply.errorCode || "server_error", message, param: null, sequence_number: seq });
  return ev("error", { type: "error", error: { type: reply.errorCode || "overloaded_error", message: reply.errorMessage || "Overloaded" } });
}

/** @param {Made["dialect"]} dialect */
function malformedEvent(dialect) {
  const name = { chat: null, responses: "response.output_text.delta", anthropic: "content_block_delta" }[dialect];
  return ev(name, '{"type": "not json');
}

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Writes `made` as an event stream with the reply's faults.
 * @param {http.ServerResponse} res @param {Made} made @param {StreamReply} reply @param {Record<string, string>} headers
 */
async function stream(res, made, reply, headers) {
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", ...headers });
  res.flushHeaders();
  let events = made.events;
  if (reply.noTerminal) events = events.slice(0, -1);
  /** @type {[number, typeof FAULTS[number]][]} */
  let pending = [];
  for (const fault of FAULTS) {
    const at = reply[fault];
    if (typeof at === "number") pending.push([at, fault]);
  }
  const deltas = events.filter((e) => e.delta).length;
  const firstDelta = events.findIndex((e) => e.delta);
  const first = firstDelta === -1 ? events.length - 1 : firstDelta;
  /** @param {string} text */
  const write = (text) => {
    if (!res.destroyed) res.write(text);
  };
  let written = 0;
  let lastSeq = -1;
  let back = false;
  for (let i = 0; i <= events.length; i += 1) {
    if (i >= first) {
      for (const [at, fault] of [...pending]) {
        if (written < Math.min(at, deltas)) continue;
        pending = pending.filter(([, f]) => f !== fault);
        if (fault === "sequenceBackAfter") back = true;
        else if (fault === "malformedAfter") write(frame(malformedEvent(made.dialect), null));
        else if (fault === "stallAfter") await sleep(Number(reply.stallS ?? 1) * 1000);
        else if (fault === "errorAfter") {
          write(frame(errorEvent(made.dialect, reply, lastSeq + 1), null));
          res.end();
          return;
        } else if (fault === "endAfter") {
          res.end();
          return;
        } else {
          // Let the written frames leave, then drop the connection without the body's last chunk.
          await new Promise((resolve) => res.socket?.write("", () => resolve(undefined)) ?? resolve(undefined));
          if (reply.cutReset) res.socket?.resetAndDestroy();
          else res.socket?.destroy();
          return;
        }
      }
    }
    const event = events[i];
    if (event === undefined) break;
    /** @type {number | null} */
    let seq = null;
    if (made.dialect === "responses") {
      seq = Number(event.data.sequence_number);
      if (back) {
        seq = Math.max(0, lastSeq - 1);
        back = false;
      }
      lastSeq = seq;
    }
    write(frame(event, seq));
    if (event.delta) written += 1;
  }
  res.end();
}

/**
 * A scripted streaming server; see the top of this file.
 * @param {Record<string, Record<string, unknown>[]>} script
 */
export async function sseServer(script) {
  /** @type {StreamRequest[]} */
  const requests = [];
  /** @type {Map<string, Made>} */
  const responses = new Map();
  /** @type {Map<string, number>} */
  const counts = new Map();
  /**
   * @param {http.ServerResponse} res @param {number} status @param {unknown} document @param {Record<string, string>} [headers]
   */
  const json = (res, status, document, headers = {}) => {
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify(document));
  };
  /** @param {http.IncomingMessage} req @param {http.ServerResponse} res @param {string} raw */
  const answer = async (req, res, raw) => {
    const arrivedAt = performance.now();
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    const path = url.pathname;
    const route = path.split("/")[1] ?? "";
    const rest = path.slice(route.length + 1);
    const query = Object.fromEntries(url.searchParams);
    /** @type {any} */
    let body = null;
    try {
      body = raw ? JSON.parse(raw) : null;
    } catch {
      body = null;
    }
    const key = req.headers["idempotency-key"];
    requests.push({ route, method: req.method ?? "", path, query, idempotencyKey: Array.isArray(key) ? key.join(",") : key, arrivedAt, body });
    const n = counts.get(route) ?? 0;
    counts.set(route, n + 1);
    const replies = script[route];
    const reply = replies === undefined || replies.length === 0 ? undefined : camel(/** @type {Record<string, unknown>} */ (replies[Math.min(n, replies.length - 1)]));
    const request = body !== null && typeof body === "object" ? body : {};
    const method = req.method ?? "";
    /** @type {"chat" | "responses" | "resume" | "anthropic"} */
    let dialect;
    if (method === "POST" && rest === "/chat/completions") dialect = "chat";
    else if (method === "POST" && rest === "/responses") dialect = "responses";
    else if (method === "GET" && rest.startsWith("/responses/")) dialect = "resume";
    else if (method === "POST" && rest === "/v1/messages") dialect = "anthropic";
    else return json(res, 404, { error: { message: `no such endpoint: ${method} ${path}` } });
    if (reply === undefined) return json(res, 404, errorBody(dialect === "anthropic" ? "anthropic" : "openai", 404, {}));
    const headers = reply.headers ?? {};
    const status = Number(reply.status ?? 200);
    if (status >= 400) return json(res, status, errorBody(dialect, status, reply), headers);
    if (dialect === "resume") {
      const id = rest.slice("/responses/".length);
      const stored = responses.get(id);
      if (stored === undefined) return json(res, 404, errorBody("openai", 404, { errorMessage: `No response with id '${id}'` }));
      if (query.stream !== "true") return json(res, 200, stored.final, headers);
      const after = Number(query.starting_after ?? -1);
      return stream(res, { ...stored, events: stored.events.filter((e) => e.data.sequence_number > after) }, reply, headers);
    }
    /** @type {Made} */
    let made;
    if (dialect === "chat") made = chatScript(reply, reply.id ?? `chatcmpl-${route}_${n}`, request);
    else if (dialect === "responses") {
      made = responsesScript(reply, reply.id ?? `resp_${route}_${n}`, request);
      responses.set(String(made.final.id), made);
    } else made = anthropicScript(reply, reply.id ?? `msg_${route}_${n}`, request);
    if (request.stream === true) return stream(res, made, reply, headers);
    return json(res, 200, made.final, headers);
  };
  const server = http.createServer((req, res) => {
    let raw = "";
    req.on("data", (chunk) => {
      raw += chunk;
    });
    req.on("end", () => {
      answer(req, res, raw).catch(() => res.destroy());
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no address");
  const base = `http://127.0.0.1:${address.port}`;
  return {
    base,
    requests,
    /** The base URL an OpenAI or Anthropic client takes for `route`. @param {string} route */
    url: (route) => `${base}/${route}`,
    /** @param {string} [route] */
    count: (route) => requests.filter((r) => route === undefined || r.route === route).length,
    /** @returns {Promise<void>} */
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve(undefined));
        server.closeAllConnections();
      }),
  };
}
