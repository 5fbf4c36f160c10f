// Runs one scenario of Google's Node clients (@google-cloud/tasks, @google-cloud/scheduler)
// against the emulator and prints what each call answered as JSON, for the pytest suite
// (test_node_clients.py) to compare with Google's documentation.
//
//   node node_driver.mjs SCENARIO TRANSPORT REST_PORT GRPC_PORT TARGET_URL
//
// SCENARIO: tasks | scheduler. TRANSPORT: grpc (the clients' default) | rest (fallback: true).
// Every step answers {"ok": summary} or {"error": {"code": gRPC code, "message": ...}}.
import {CloudTasksClient} from '@google-cloud/tasks';
import {CloudSchedulerClient} from '@google-cloud/scheduler';
import {grpc} from 'google-gax';
import {PassThroughClient} from 'google-auth-library';

const [scenario, transport, restPort, grpcPort, targetUrl] = process.argv.slice(2);
const PROJECT = 'node-project';
const LOCATION = 'us-central1';
const PARENT = `projects/${PROJECT}/locations/${LOCATION}`;

// No Google credentials: gRPC goes over an insecure channel, REST with no Authorization
// (google-auth-library's PassThroughClient, "useful for emulators").
function options() {
  const common = {apiEndpoint: '127.0.0.1', projectId: PROJECT};
  if (transport === 'grpc') {
    return {...common, port: Number(grpcPort), sslCreds: grpc.credentials.createInsecure()};
  }
  return {...common, port: Number(restPort), protocol: 'http', fallback: true, authClient: new PassThroughClient()};
}

const seconds = d => (d ? Number(d.seconds || 0) + (d.nanos || 0) / 1e9 : null);
const results = {};

async function step(name, call, summary = x => x) {
  try {
    const [answer] = await call();
    results[name] = {ok: summary(answer)};
  } catch (err) {
    results[name] = {error: {code: err.code ?? null, message: typeof err.details === 'string' && err.details ? err.details : String(err.message)}};
  }
}

const taskSummary = t => ({
  name: t.name,
  view: t.view,
  httpMethod: t.httpRequest?.httpMethod,
  body: t.httpRequest?.body ? Buffer.from(t.httpRequest.body).toString() : '',
  dispatchDeadline: seconds(t.dispatchDeadline),
  createTimeNanos: t.createTime?.nanos ?? 0,
  dispatchCount: t.dispatchCount ?? 0,
});
const queueSummary = q => ({
  name: q.name,
  state: q.state,
  maxAttempts: q.retryConfig?.maxAttempts,
  minBackoff: seconds(q.retryConfig?.minBackoff),
  maxBackoff: seconds(q.retryConfig?.maxBackoff),
  maxDispatchesPerSecond: q.rateLimits?.maxDispatchesPerSecond,
});
const jobSummary = j => ({
  name: j.name,
  state: j.state,
  schedule: j.schedule,
  timeZone: j.timeZone,
  uri: j.httpTarget?.uri,
  attemptDeadline: seconds(j.attemptDeadline),
  retryCount: j.retryConfig?.retryCount ?? 0,
});

async function tasks() {
  const client = new CloudTasksClient(options());
  const queue = `${PARENT}/queues/node-${transport}`;
  const task = (id, extra = {}) => ({
    ...(id ? {name: `${queue}/tasks/${id}`} : {}),
    httpRequest: {url: targetUrl, body: Buffer.from('{"n": 1}'), headers: {'Content-Type': 'application/json'}},
    ...extra,
  });
  await step('getLocation', () => client.getLocation({name: PARENT}), l => l.locationId);
  await step('createQueue', () => client.createQueue({parent: PARENT, queue: {name: queue}}), queueSummary);
  await step('createQueueAgain', () => client.createQueue({parent: PARENT, queue: {name: queue}}), queueSummary);
  await step('getQueue', () => client.getQueue({name: queue}), queueSummary);
  await step('getMissingQueue', () => client.getQueue({name: `${queue}-missing`}), queueSummary);
  await step('listQueues', () => client.listQueues({parent: PARENT}), qs => qs.map(q => q.name));
  await step('updateMissingQueue', () => client.updateQueue({
    queue: {name: `${queue}-upserted`, retryConfig: {maxAttempts: 7}},
    updateMask: {paths: ['retry_config.max_attempts']},
  }), queueSummary);
  await step('pauseQueue', () => client.pauseQueue({name: queue}), queueSummary);
  await step('createTask', () => client.createTask({
    parent: queue,
    task: task('first', {dispatchDeadline: {seconds: 20, nanos: 123456789}}),
  }), taskSummary);
  await step('createTaskAgain', () => client.createTask({parent: queue, task: task('first')}), taskSummary);
  await step('createUnnamedTask', () => client.createTask({parent: queue, task: task()}), taskSummary);
  await step('createTaskInMissingQueue', () => client.createTask({
    parent: `${queue}-missing`, task: {httpRequest: {url: targetUrl}},
  }), taskSummary);
  await step('getTaskFull', () => client.getTask({name: `${queue}/tasks/first`, responseView: 'FULL'}), taskSummary);
  await step('listTasks', () => client.listTasks({parent: queue}), ts => ts.map(t => t.name).sort());
  await step('listTasksTooLarge', () => client.listTasks({parent: queue, pageSize: 5000}, {autoPaginate: false}),
    ts => ts.length);
  await step('runTask', () => client.runTask({name: `${queue}/tasks/first`}), taskSummary);
  await step('deleteTask', () => client.deleteTask({name: `${queue}/tasks/first`}), () => 'deleted');
  await step('getDeletedTask', () => client.getTask({name: `${queue}/tasks/first`}), taskSummary);
  await step('createDeletedName', () => client.createTask({parent: queue, task: task('first')}), taskSummary);
  await step('deleteQueue', () => client.deleteQueue({name: queue}), () => 'deleted');
  await step('createTaskInDeletedQueue', () => client.createTask({
    parent: queue, task: {httpRequest: {url: targetUrl}},
  }), taskSummary);
  // The v2 client of @google-cloud/tasks has no BatchCreateTasks (only v2beta3 has it).
  results.batchCreateTasks = {ok: typeof client.batchCreateTasks};
  await client.close();
}

async function scheduler() {
  const client = new CloudSchedulerClient(options());
  const name = `${PARENT}/jobs/node-${transport}`;
  const job = {
    name,
    schedule: '0 3 * * *',
    timeZone: 'Etc/UTC',
    httpTarget: {uri: targetUrl, httpMethod: 'POST', body: Buffer.from('{"n": 1}')},
  };
  await step('createJob', () => client.createJob({parent: PARENT, job}), jobSummary);
  await step('createJobAgain', () => client.createJob({parent: PARENT, job}), jobSummary);
  await step('getJob', () => client.getJob({name}), jobSummary);
  await step('listJobs', () => client.listJobs({parent: PARENT}), js => js.map(j => j.name));
  await step('updateJob', () => client.updateJob({
    job: {name, schedule: '30 4 * * *'}, updateMask: {paths: ['schedule']},
  }), jobSummary);
  await step('pauseJob', () => client.pauseJob({name}), jobSummary);
  await step('resumeJob', () => client.resumeJob({name}), jobSummary);
  await step('runJob', () => client.runJob({name}), jobSummary);
  await step('deleteJob', () => client.deleteJob({name}), () => 'deleted');
  await step('getDeletedJob', () => client.getJob({name}), jobSummary);
  await client.close();
}

await {tasks, scheduler}[scenario]();
process.stdout.write(JSON.stringify(results));
