// OpenWhisk's own JavaScript client (the `openwhisk` package, as the wsk CLI's users script it)
// against the embedded platform's REST API: each call's outcome, one JSON line each, for
// tests/platform/test_openwhisk_js.py to check. OW_APIHOST and OW_AUTH ("uuid:key") name the
// server.
"use strict";

const openwhisk = require("openwhisk");

const ow = openwhisk({ apihost: process.env.OW_APIHOST, api_key: process.env.OW_AUTH });
const HELLO = [
  "def main(args):",
  "    print('hello log')",
  "    return {'greeting': 'hi ' + args.get('name', 'x')}",
  "",
].join("\n");
const FAILS = "def main(args):\n    return {'error': 'bad input'}\n";

async function step(name, call) {
  let outcome;
  try {
    outcome = { step: name, ok: true, result: await call() };
  } catch (error) {
    // The client's errors carry the answer's status and body (`error`).
    outcome = { step: name, ok: false, status: error.statusCode ?? null, error: error.error ?? null,
      message: error.message };
  }
  console.log(JSON.stringify(outcome));
  return outcome;
}

// An activation's record once it has one: a non-blocking invoke's is written as it ends.
async function ended(activationId) {
  for (let tries = 0; tries < 200; tries += 1) {
    try {
      return await ow.activations.get({ name: activationId });
    } catch (error) {
      if (error.statusCode !== 404) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`activation ${activationId} never ended`);
}

(async () => {
  const limits = { memory: 256, timeout: 10000 };
  await step("create", () => ow.actions.create(
    { name: "hello", action: HELLO, kind: "python:3", limits }));
  // Without a kind the client asks for Node.js's, which this platform does not run.
  await step("create nodejs", () => ow.actions.create({ name: "other", action: HELLO }));
  await step("create again", () => ow.actions.create(
    { name: "hello", action: HELLO, kind: "python:3" }));
  await step("get", () => ow.actions.get({ name: "hello" }));
  await step("list", () => ow.actions.list({ limit: 5 }));
  await step("invoke result", () => ow.actions.invoke(
    { name: "hello", blocking: true, result: true, params: { name: "js" } }));
  await step("invoke blocking", () => ow.actions.invoke({ name: "hello", blocking: true }));
  const started = await step("invoke", () => ow.actions.invoke({ name: "hello" }));
  await step("activation", () => ended(started.result.activationId));
  await step("result", () => ow.activations.result({ name: started.result.activationId }));
  await step("logs", () => ow.activations.logs({ name: started.result.activationId }));
  await step("activations", () => ow.activations.list({ name: "hello", limit: 10, docs: true }));
  await step("update", () => ow.actions.update(
    { name: "hello", action: HELLO, kind: "python:3", limits: { memory: 512 } }));
  await step("create fails", () => ow.actions.create(
    { name: "fails", action: FAILS, kind: "python:3" }));
  await step("invoke fails", () => ow.actions.invoke(
    { name: "fails", blocking: true, result: true }));
  await step("invoke missing", () => ow.actions.invoke({ name: "missing", blocking: true }));
  await step("namespaces", () => ow.namespaces.list());
  await step("triggers", () => ow.triggers.list());
  await step("delete", () => ow.actions.delete({ name: "hello" }));
  await step("get deleted", () => ow.actions.get({ name: "hello" }));
})();
