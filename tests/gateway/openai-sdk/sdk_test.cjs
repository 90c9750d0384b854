// Drives tandem's HTTP gateway with the official OpenAI SDK (the version package-lock.json
// pins): completions and chat, streaming and not, logprobs, and the SDK's errors for a bad
// value and an unknown model; or (MODE "tools") tool calls and reasoning_content from a model
// that writes a think block and a get_weather call (make-model --script-file: ARGUMENTS is the
// call's arguments' JSON). Prints "ok: ..." per check; exits 1 at the first that fails.
//
//   NODE_PATH=DEST/node_modules node sdk_test.cjs BASE_URL MODEL [tools ARGUMENTS]
const { OpenAI } = require('openai');

const [baseURL, model, mode, toolArguments] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.TANDEM_API_KEY || 'none', maxRetries: 0, timeout: 60000 });

function check(cond, what, detail) {
  if (!cond) {
    console.error('FAIL: ' + what + (detail === undefined ? '' : ': ' + JSON.stringify(detail)));
    process.exit(1);
  }
  console.log('ok: ' + what);
}

async function expectError(status, what, body) {
  try {
    await body();
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status, what, { status: e.status, message: e.message });
    return e;
  }
  check(false, what + ' (no error)');
}

async function completions() {
  const greedy = { model, prompt: [1, 2, 3], max_tokens: 8, ignore_eos: true };
  const c = await client.completions.create({ ...greedy, logprobs: 2 });
  const choice = c.choices[0];
  check(c.object === 'text_completion' && choice.finish_reason === 'length' && c.usage.completion_tokens === 8,
        'completion: 8 tokens, finish_reason length', c);
  check(choice.logprobs.tokens.length === 8 && choice.logprobs.token_logprobs.every((l) => l <= 0) &&
            choice.logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1),
        'completion logprobs: one entry per token with its top alternatives', choice.logprobs);
  const stream = await client.completions.create({ ...greedy, stream: true, stream_options: { include_usage: true } });
  let text = '', events = 0, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason === null) ++events;
  }
  check(text === choice.text && events === 8 && usage && usage.completion_tokens === 8,
        'streamed completion: one event per token, the same text, usage at the end', { text, events, usage });
}

async function chat() {
  const ask = {
    model,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }],
    max_completion_tokens: 6,
    ignore_eos: true,
  };
  const c = await client.chat.completions.create({ ...ask, logprobs: true, top_logprobs: 2 });
  const choice = c.choices[0];
  check(c.object === 'chat.completion' && choice.message.role === 'assistant' && c.usage.completion_tokens === 6 &&
            choice.finish_reason === 'length',
        'chat completion', c);
  check(choice.logprobs.content.length === 6 && choice.logprobs.content.every((t) => t.top_logprobs.length === 2),
        'chat logprobs: one entry per token, two alternatives each', choice.logprobs);
  const stream = await client.chat.completions.create({ ...ask, stream: true });
  let text = '', role = null, finish = null;
  for await (const chunk of stream) {
    const delta = chunk.choices[0].delta;
    if (delta.role) role = delta.role;
    text += delta.content || '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  check(role === 'assistant' && text === choice.message.content && finish === 'length',
        'streamed chat: the same text as the whole response', { role, text, finish });
}

async function errors() {
  const e = await expectError(400, 'a bad value is a 400 naming the field', () =>
    client.completions.create({ model, prompt: 'x', max_tokens: 2, temperature: -1 }));
  check(e.param === 'temperature' && /temperature/.test(e.message), 'the 400 names temperature', e.error);
  await expectError(404, 'another model is a 404', () =>
    client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 }));
  await expectError(400, 'response_format is refused by name', () =>
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }],
                                     response_format: { type: 'json_object' } }));
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, 'models lists the served model', models.data);
}

async function tools() {
  const ask = {
    model,
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather of a city',
                                            parameters: { type: 'object', properties: { where: { type: 'object' } } } } }],
  };
  const expected = JSON.parse(toolArguments);
  const c = await client.chat.completions.create(ask);
  const message = c.choices[0].message;
  check(c.choices[0].finish_reason === 'tool_calls' && message.content === null &&
            message.reasoning_content === 'The user wants the weather.\n',
        'chat with tools: reasoning_content, no content, finish_reason tool_calls', c);
  const call = message.tool_calls && message.tool_calls[0];
  check(message.tool_calls.length === 1 && call.type === 'function' && /^call_/.test(call.id) &&
            call.function.name === 'get_weather' &&
            JSON.stringify(JSON.parse(call.function.arguments)) === JSON.stringify(expected),
        'chat with tools: one get_weather call with its arguments', message.tool_calls);
  // The SDK's stream helper accumulates the calls' deltas; reasoning_content is summed here.
  const stream = client.chat.completions.stream(ask);
  let reasoning = '', argumentDeltas = 0;
  stream.on('chunk', (chunk) => {
    const delta = chunk.choices.length ? chunk.choices[0].delta : {};
    reasoning += delta.reasoning_content || '';
  });
  stream.on('tool_calls.function.arguments.delta', () => ++argumentDeltas);
  const done = await stream.finalChatCompletion();
  const streamed = done.choices[0];
  const scall = streamed.message.tool_calls && streamed.message.tool_calls[0];
  check(streamed.finish_reason === 'tool_calls' && reasoning === 'The user wants the weather.\n' &&
            streamed.message.tool_calls.length === 1 && scall.function.name === 'get_weather' &&
            scall.function.arguments === call.function.arguments && scall.id.startsWith('call_') &&
            argumentDeltas > 3,
        'streamed chat with tools: the stream helper assembles the same call from ' + argumentDeltas + ' deltas',
        { streamed, reasoning, argumentDeltas });
}

(async () => {
  if (mode === 'tools') return tools();
  await completions();
  await chat();
  await errors();
})().catch((e) => {
  console.error('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
