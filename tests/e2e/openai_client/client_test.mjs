// The official `openai` npm client against a splitserve gateway: models, chat (non-streaming),
// streaming with usage, completions of a batch of prompts, and a tool-call round trip, asserting
// the shapes the client hands back.
//
//   SPLITSERVE_BASE_URL   the gateway's API root, e.g. http://127.0.0.1:8000/v1 (required)
//   SPLITSERVE_API_KEY    bearer key, when the gateway has keys (default: "none")
//   SPLITSERVE_MODEL      model id (default: the first of GET /v1/models)
//   SPLITSERVE_FAKE=1     the gateway serves tests/coordinator/fake_gateway_main.cc: the exact
//                         texts it scripts are checked too. Without it (a real model) only the
//                         shapes are, and the tool round trip's second half runs only if the
//                         model did call the tool.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.SPLITSERVE_BASE_URL;
if (!baseURL) {
  console.error('client_test: SPLITSERVE_BASE_URL is not set');
  process.exit(2);
}
const fake = process.env.SPLITSERVE_FAKE === '1';
const client = new OpenAI({
  baseURL,
  apiKey: process.env.SPLITSERVE_API_KEY || 'none',
  maxRetries: 0,
  timeout: 120_000,
});

// The texts fake_gateway_main.cc scripts.
const kHello = "Hello! I am splitserve's fake engine. 2 + 2 = 4.";
const kAnswer = 'It is sunny in Paris, 22 degrees.';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city.',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' } },
      required: ['city'],
    },
  },
}];

let model = process.env.SPLITSERVE_MODEL;
async function modelId() {
  if (!model) {
    const page = await client.models.list();
    model = page.data[0].id;
  }
  return model;
}

function checkUsage(usage) {
  assert.ok(usage, 'usage present');
  assert.equal(typeof usage.prompt_tokens, 'number');
  assert.equal(typeof usage.completion_tokens, 'number');
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.ok(usage.prompt_tokens > 0);
}

test('models.list', async () => {
  const page = await client.models.list();
  assert.ok(page.data.length >= 1);
  assert.equal(page.data[0].object, 'model');
  assert.equal(typeof page.data[0].id, 'string');
});

test('chat completion', async () => {
  const r = await client.chat.completions.create({
    model: await modelId(),
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 64,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.id, 'string');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
  checkUsage(r.usage);
  if (fake) {
    assert.equal(c.message.content, kHello);
    assert.equal(c.finish_reason, 'stop');
  }
});

test('chat completion with a stop string and logprobs', async () => {
  const r = await client.chat.completions.create({
    model: await modelId(),
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 64,
    stop: ['2 + 2'],
    logprobs: true,
    top_logprobs: 2,
  });
  const c = r.choices[0];
  assert.ok(Array.isArray(c.logprobs.content));
  for (const e of c.logprobs.content) {
    assert.equal(typeof e.token, 'string');
    assert.equal(typeof e.logprob, 'number');
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
  }
  if (fake) {
    assert.equal(c.message.content, "Hello! I am splitserve's fake engine. ");
    assert.equal(c.finish_reason, 'stop');
    const text = Buffer.from(c.logprobs.content.flatMap((e) => e.bytes)).toString('utf8');
    assert.equal(text, c.message.content);
  }
});

test('completions with a batch of prompts', async () => {
  const m = await modelId();
  const prompts = ['Hello', 'The sky is'];
  const r = await client.completions.create({ model: m, prompt: prompts, n: 2, max_tokens: 4 });
  assert.equal(r.object, 'text_completion');
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);  // prompt p's: 2p, 2p + 1
  for (const c of r.choices) {
    assert.equal(typeof c.text, 'string');
    if (fake) assert.equal(c.finish_reason, 'length');
  }
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 4 * 4);
  if (fake) assert.equal(r.usage.completion_tokens, 4 * 4);
  // usage counts each prompt once
  let alone = 0;
  for (const p of prompts) {
    alone += (await client.completions.create({ model: m, prompt: p, max_tokens: 1 })).usage
      .prompt_tokens;
  }
  assert.equal(r.usage.prompt_tokens, alone);
});

test('streaming chat completion', async () => {
  const stream = await client.chat.completions.create({
    model: await modelId(),
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 64,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  let role = null;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) content += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(role, 'assistant');
  assert.ok(['stop', 'length'].includes(finish), finish);
  checkUsage(usage);
  if (fake) assert.equal(content, kHello);
});

test('tool call round trip', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({
    model: await modelId(),
    messages,
    tools,
    tool_choice: 'auto',
    max_tokens: 256,
  });
  const msg = first.choices[0].message;
  if (!msg.tool_calls || msg.tool_calls.length === 0) {
    assert.ok(!fake, 'the fake engine calls get_weather');
    console.log('# the model answered without calling the tool: round trip not exercised');
    return;
  }
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const call = msg.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(typeof call.id, 'string');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args, 'object');
  if (fake) {
    assert.deepEqual(args, { city: 'Paris' });
    assert.equal(msg.content, 'Let me check.');
  }

  // The same request streamed: the call arrives as tool_calls deltas.
  const stream = await client.chat.completions.create({
    model: await modelId(),
    messages,
    tools,
    max_tokens: 256,
    stream: true,
  });
  const streamed = {};
  let finish = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      for (const t of choice.delta.tool_calls ?? []) {
        const s = (streamed[t.index] ??= { id: '', name: '', arguments: '' });
        if (t.id) s.id = t.id;
        if (t.function?.name) s.name += t.function.name;
        if (t.function?.arguments) s.arguments += t.function.arguments;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  if (fake) {
    assert.equal(finish, 'tool_calls');
    assert.equal(streamed[0].name, 'get_weather');
    assert.deepEqual(JSON.parse(streamed[0].arguments), { city: 'Paris' });
  }

  // Send the result back; the model answers.
  messages.push(msg);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"sky": "sunny", "celsius": 22}' });
  const second = await client.chat.completions.create({
    model: await modelId(),
    messages,
    tools,
    max_tokens: 128,
  });
  const answer = second.choices[0];
  assert.equal(answer.message.role, 'assistant');
  assert.equal(typeof answer.message.content, 'string');
  checkUsage(second.usage);
  if (fake) {
    assert.equal(answer.message.content, kAnswer);
    assert.equal(answer.finish_reason, 'stop');
    assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
  }
});

test('errors come back as APIError with OpenAI bodies', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.APIError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({
      model: await modelId(),
      messages: [{ role: 'user', content: 'x' }],
      top_logprobs: 3,
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs');
});
