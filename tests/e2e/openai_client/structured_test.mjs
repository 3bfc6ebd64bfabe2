// Constrained decoding through the official `openai` npm client against `splitserve up` on the
// bundled random-weight model, which never writes JSON or calls a tool by itself: whatever it
// returns under a constraint is the grammar's doing.
//
//   * response_format json_schema (strict) for 50 schemas: every reply parses and validates (ajv);
//   * chat.completions.parse with a zod schema (openai/helpers/zod);
//   * json_object, vLLM's structured_outputs (regex, choice) and a streamed json_schema reply;
//   * tool_choice "required" and a named tool: a call every time, arguments valid against the
//     tool's parameters; "none": never a call.
//
// The model's strings and arrays have no reason to end, so the schemas bound them (maxLength,
// maxItems, enums, formats); a schema without bounds is enforced just the same, but a random
// model may then run into max_tokens before closing a string.
//
//   SPLITSERVE_BASE_URL  the gateway's API root (required); SPLITSERVE_MODEL the model id.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const baseURL = process.env.SPLITSERVE_BASE_URL;
if (!baseURL) {
  console.error('structured_test: SPLITSERVE_BASE_URL is not set');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 300_000 });
const model = process.env.SPLITSERVE_MODEL || 'tiny';
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const str = (n) => ({ type: 'string', maxLength: n });
const obj = (properties, required = Object.keys(properties)) => ({
  type: 'object', properties, required, additionalProperties: false,
});
const arr = (items, maxItems = 3, minItems = 0) => ({ type: 'array', items, maxItems, minItems });

// 50 schemas over what OpenAI strict mode, pydantic and zod emit: types, nesting, enums, consts,
// anyOf, nullable types, $defs and recursive refs, prefixItems, lengths, formats, patterns,
// integer ranges, optional properties.
const schemas = [
  obj({ name: str(12), age: { type: 'integer' } }),
  obj({ ok: { type: 'boolean' } }),
  obj({ value: { type: 'number' } }),
  obj({ nothing: { type: 'null' } }),
  obj({ color: { type: 'string', enum: ['red', 'green', 'blue'] } }),
  obj({ kind: { const: 'point' }, x: { type: 'integer' }, y: { type: 'integer' } }),
  obj({ tags: arr(str(6)) }),
  obj({ ids: arr({ type: 'integer' }, 4, 1) }),
  obj({ flags: arr({ type: 'boolean' }, 5, 2) }),
  obj({ matrix: arr(arr({ type: 'integer' }, 2), 2) }),
  obj({ person: obj({ first: str(8), last: str(8) }) }),
  obj({ a: obj({ b: obj({ c: obj({ d: str(4) }) }) }) }),
  obj({ id: { type: 'string', format: 'uuid' } }),
  obj({ day: { type: 'string', format: 'date' } }),
  obj({ at: { type: 'string', format: 'date-time' } }),
  obj({ clock: { type: 'string', format: 'time' } }),
  obj({ code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2,4}$' } }),
  obj({ hex: { type: 'string', pattern: '^#[0-9a-f]{6}$' } }),
  obj({ word: { type: 'string', pattern: '^(yes|no|maybe)$' } }),
  obj({ pct: { type: 'integer', minimum: 0, maximum: 100 } }),
  obj({ year: { type: 'integer', minimum: 1900, maximum: 2100 } }),
  obj({ neg: { type: 'integer', maximum: -1, minimum: -50 } }),
  obj({ v: { anyOf: [str(5), { type: 'integer' }] } }),
  obj({ v: { anyOf: [{ type: 'null' }, obj({ w: str(3) })] } }),
  obj({ maybe: { type: ['string', 'null'], maxLength: 6 } }),
  obj({ n: { type: ['integer', 'boolean'] } }),
  obj({ pair: { type: 'array', prefixItems: [str(4), { type: 'integer' }], items: false } }),
  obj({ name: str(10), nick: str(5) }, ['name']),
  obj({ a: { type: 'integer' }, b: { type: 'integer' }, c: { type: 'integer' } }, ['b']),
  obj({ short: { type: 'string', minLength: 2, maxLength: 4 } }),
  obj({ items: arr(obj({ sku: str(6), qty: { type: 'integer', minimum: 1, maximum: 9 } }), 2) }),
  obj({ status: { enum: ['ok', 1, null, true] } }),
  obj({ level: { type: 'integer', enum: [1, 2, 3] } }),
  {
    $defs: { pt: obj({ x: { type: 'integer' }, y: { type: 'integer' } }) },
    ...obj({ from: { $ref: '#/$defs/pt' }, to: { $ref: '#/$defs/pt' } }),
  },
  {
    definitions: { tag: { type: 'string', enum: ['a', 'b', 'c'] } },
    ...obj({ tags: arr({ $ref: '#/definitions/tag' }) }),
  },
  {
    $defs: {
      node: obj({ v: { type: 'integer' }, next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } }),
    },
    ...obj({ list: { $ref: '#/$defs/node' } }),
  },
  obj({ ev: { oneOf: [obj({ t: { const: 'click' }, x: { type: 'integer' } }), obj({ t: { const: 'key' }, k: str(1) })] } }),
  obj({
    m: {
      allOf: [
        { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] },
        { type: 'object', properties: { b: { type: 'boolean' } }, required: ['b'] },
      ],
    },
  }),
  obj({ price: { type: 'number' }, currency: { type: 'string', enum: ['EUR', 'USD'] } }),
  obj({ coords: { type: 'array', items: { type: 'number' }, minItems: 2, maxItems: 2 } }),
  obj({ title: str(20), done: { type: 'boolean' }, due: { type: ['string', 'null'], format: 'date' } }),
  obj({ user: obj({ id: { type: 'integer' }, roles: arr({ enum: ['admin', 'dev'] }, 2) }) }),
  obj({ e: { type: 'string', enum: ['日本', 'ü', 'a"b', 'back\\slash'] } }),
  obj({ s: { type: 'string', maxLength: 0 } }),
  obj({ empty: arr({ type: 'integer' }, 0) }),
  obj({ x: { type: 'number' }, y: { type: 'number' }, z: { type: 'number' } }),
  obj({ ok: { type: 'boolean' }, reason: { anyOf: [str(8), { type: 'null' }] } }),
  { type: 'object', properties: { q: { type: 'integer' } }, required: ['q'] },
  obj({ grid: arr(arr({ enum: [0, 1] }, 3, 3), 3, 3) }),
  obj({ version: { type: 'string', pattern: '^[0-9]\\.[0-9]{1,2}$' }, stable: { type: 'boolean' } }),
];

// Runs `fn` over `items` with at most `n` in flight (the engine batches them).
async function pool(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }));
  return out;
}

test('50 json_schema response formats: every reply parses and validates', async () => {
  assert.equal(schemas.length, 50);
  const results = await pool(schemas, 8, async (schema, i) => {
    const r = await client.chat.completions.create({
      model, max_tokens: 300, seed: i,
      messages: [{ role: 'user', content: `Reply ${i} in JSON.` }],
      response_format: { type: 'json_schema', json_schema: { name: `s${i}`, strict: true, schema } },
    });
    return r.choices[0];
  });
  results.forEach((choice, i) => {
    assert.equal(choice.finish_reason, 'stop', `schema ${i}: ${choice.message.content}`);
    const value = JSON.parse(choice.message.content);
    const validate = ajv.compile(schemas[i]);
    assert.ok(validate(value), `schema ${i}: ${choice.message.content}: ${ajv.errorsText(validate.errors)}`);
  });
});

test('chat.completions.parse with a zod schema', async () => {
  const Weather = z.object({
    city: z.string().max(12),
    temperature: z.number(),
    unit: z.enum(['C', 'F']),
    alerts: z.array(z.string().max(6)).max(2),
  });
  const r = await client.chat.completions.parse({
    model, max_tokens: 300,
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    response_format: zodResponseFormat(Weather, 'weather'),
  });
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'stop', msg.content);
  assert.ok(msg.parsed, msg.content);
  assert.deepEqual(Weather.parse(msg.parsed), msg.parsed);
});

test('json_object, regex, choice and a streamed json_schema reply', async () => {
  let r = await client.chat.completions.create({
    model, max_tokens: 300, messages: [{ role: 'user', content: 'JSON please' }],
    response_format: { type: 'json_object' },
  });
  // Any object: the random model may not close it within max_tokens, but what it wrote is JSON
  // so far; when it stopped by itself it parses to an object.
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(!Array.isArray(v) && v !== null);
  } else {
    assert.ok(r.choices[0].message.content.startsWith('{'));
  }
  r = await client.chat.completions.create({
    model, max_tokens: 50, messages: [{ role: 'user', content: 'a code' }],
    structured_outputs: { regex: '[A-Z]{2}[0-9]{3}' },
  });
  assert.match(r.choices[0].message.content, /^[A-Z]{2}[0-9]{3}$/);
  const c = await client.completions.create({
    model, prompt: 'Pick one:', max_tokens: 20, structured_outputs: { choice: ['alpha', 'beta', 'gamma'] },
  });
  assert.ok(['alpha', 'beta', 'gamma'].includes(c.choices[0].text), c.choices[0].text);
  const schema = schemas[30];
  const stream = await client.chat.completions.create({
    model, max_tokens: 300, stream: true, messages: [{ role: 'user', content: 'order' }],
    response_format: { type: 'json_schema', json_schema: { name: 'order', strict: true, schema } },
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.ok(ajv.validate(schema, JSON.parse(text)), `${text}: ${ajv.errorsText()}`);
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: obj({ city: str(10), days: { type: 'integer', minimum: 1, maximum: 7 } }),
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_alarm',
      parameters: obj({ at: { type: 'string', format: 'time' }, repeat: { type: 'boolean' } }),
    },
  },
];
const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));

test('tool_choice required and named force a valid call every time; none never calls', async () => {
  const cases = [];
  for (let i = 0; i < 6; i++) {
    cases.push({ choice: 'required', seed: i });
    cases.push({ choice: { type: 'function', function: { name: 'set_alarm' } }, seed: i });
    cases.push({ choice: 'none', seed: i });
  }
  const results = await pool(cases, 6, async ({ choice, seed }) => {
    const r = await client.chat.completions.create({
      model, max_tokens: 170, seed, tools, tool_choice: choice,
      messages: [{ role: 'user', content: `Do something ${seed}` }],
    });
    return r.choices[0];
  });
  results.forEach((c, i) => {
    const { choice } = cases[i];
    const calls = c.message.tool_calls ?? [];
    if (choice === 'none') {
      assert.equal(calls.length, 0, JSON.stringify(c.message));
      return;
    }
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.ok(calls.length >= 1, JSON.stringify(c.message));
    for (const call of calls) {
      if (choice !== 'required') assert.equal(call.function.name, 'set_alarm');
      const schema = byName[call.function.name];
      assert.ok(schema, call.function.name);
      const args = JSON.parse(call.function.arguments);
      assert.ok(ajv.validate(schema, args), `${call.function.arguments}: ${ajv.errorsText()}`);
    }
  });
});
