// A worker process for the Temporal tests: the bundled test workflows and the
// loopback attempt activity on the task queue given, until it is killed.
//
//   node test/temporal-worker-child.mjs <task queue> <workflow bundle file>
//
// node --test runs every module under test/: without arguments it exits at once.
if (process.argv[2] === undefined) process.exit(0);

const { readFileSync } = await import("node:fs");
const { DefaultLogger, NativeConnection, Runtime, Worker } = await import("@temporalio/worker");
const { activities } = await import("./temporal-activities.mjs");

Runtime.install({ logger: new DefaultLogger("ERROR") });
const [taskQueue, bundleFile] = /** @type {[string, string]} */ (process.argv.slice(2));
const connection = await NativeConnection.connect({ address: process.env.TEMPORAL_ADDRESS ?? "" });
const worker = await Worker.create({
  connection,
  taskQueue,
  workflowBundle: { code: readFileSync(bundleFile, "utf8") },
  activities,
  sinks: { probe: { sealed: { fn: () => undefined } } },
  // A killed worker's sticky queue is given up quickly.
  stickyQueueScheduleToStartTimeout: "1s",
});
const running = worker.run();
process.stdout.write("ready\n");
await running;
