// Reads a fetch() response as server-sent events, yielding {event, data, id} with data parsed as JSON. The OpenAI
// stream's closing "[DONE]" ends it.
async function* readEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const raw of events) {
      const data = raw.match(/^data: ?(.*)$/m)?.[1];
      if (data === undefined) continue;
      if (data.trim() === "[DONE]") return;
      yield { event: raw.match(/^event: (.*)$/m)?.[1] ?? "message", data: JSON.parse(data),
              id: raw.match(/^id: (.*)$/m)?.[1] };
    }
  }
}
