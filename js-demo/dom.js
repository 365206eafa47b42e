// Small DOM helpers shared by the fleet and journal views.
export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

export const fmt = (n) => Number(n).toLocaleString("en-US");

export function codeSpan(code) {
  return el("span", { class: "code", text: code });
}

/** A coded error as one line: code, message, and where. */
export function describeError(err) {
  const line = el("span");
  line.append(codeSpan(err.code ?? "error"), document.createTextNode(` — ${err.message ?? ""}`));
  if (err.path) line.append(document.createTextNode(` (at ${err.path})`));
  return line;
}

/** Fill a verdict box: kind is pending, verified, drift or error. */
export function setBox(box, kind, title, lines = []) {
  box.className = `verdict ${kind}`;
  box.replaceChildren(el("strong", { text: title }), ...lines.map((l) => el("p", {}, l)));
}
