// The Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`, or `@ai-sdk/openai` on the
// Responses API) driving the weather tool loop.
// Usage: node tool_loop.mjs BASE_URL MODEL stream|non-stream [chat|responses]
// Prints one JSON line: the final text and each step's tool calls and results.
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const [baseURL, modelId, mode, api = "chat"] = process.argv.slice(2);
if (!baseURL || !modelId || !["stream", "non-stream"].includes(mode)) {
  console.error("usage: node tool_loop.mjs BASE_URL MODEL stream|non-stream");
  process.exit(2);
}

// `openai(id)` is the Responses API since @ai-sdk/openai 2.
const model =
  api === "responses"
    ? createOpenAI({ baseURL, apiKey: "sk-not-checked" })(modelId)
    : createOpenAICompatible({ name: "vllm", baseURL, apiKey: "sk-not-checked" }).chatModel(modelId);
const getWeather = tool({
  description: "Current weather in a city.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { city: { type: "string", enum: ["Paris", "Oslo"] } },
    required: ["city"],
    additionalProperties: false,
  }),
  execute: async ({ city }) => `${city}: sunny, 21 C`,
});

const options = {
  model,
  tools: { get_weather: getWeather },
  prompt: "What is the weather in Paris?",
  maxOutputTokens: 24,
  temperature: 0,
  maxRetries: 0,
  stopWhen: stepCountIs(2),
  // A random model never calls the tool by itself: force it on step one only.
  prepareStep: ({ stepNumber }) => ({
    toolChoice: stepNumber === 0 ? { type: "tool", toolName: "get_weather" } : "none",
  }),
};

let result;
if (mode === "stream") {
  const streamed = streamText({ ...options, onError: ({ error }) => { throw error; } });
  result = { text: await streamed.text, steps: await streamed.steps };
} else {
  result = await generateText(options);
}
console.log(
  JSON.stringify({
    text: result.text,
    steps: result.steps.map((step) => ({
      toolCalls: step.toolCalls.map(({ toolName, input }) => ({ toolName, input })),
      toolResults: step.toolResults.map(({ toolName, output }) => ({ toolName, output })),
    })),
  }),
);
