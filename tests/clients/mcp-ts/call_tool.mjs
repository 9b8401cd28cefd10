// The TypeScript MCP SDK (@modelcontextprotocol/sdk, 2025-11-25 protocol) against ferry's /mcp:
// `callTool` validates structuredContent against the tool's outputSchema even when isError is
// true, so a failure envelope that does not fit the schema throws McpError -32602 here.
//
// Usage: node call_tool.mjs http://127.0.0.1:PORT/mcp
// Prints one JSON line with what it saw; exits non-zero (with the reason on stderr) on any failed check.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = process.argv[2];
if (!url) {
  console.error('usage: node call_tool.mjs MCP_URL');
  process.exit(2);
}

function check(cond, what, value) {
  if (!cond) {
    throw new Error(`check failed: ${what}: ${JSON.stringify(value)}`);
  }
}

async function main() {
  const client = new Client({ name: 'ferry-test-ts', version: '0.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const out = { protocol: transport.protocolVersion ?? null };

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  check(names.includes('file_status') && names.includes('file_upload_begin'), 'tools/list names', names);
  check(tools.every((t) => t.outputSchema && t.outputSchema.type === 'object'), 'every tool has an object outputSchema', tools.map((t) => [t.name, t.outputSchema]));

  // A failing tool: unknown file id. Must come back as isError with the envelope, not throw -32602.
  let failed;
  try {
    failed = await client.callTool({ name: 'file_status', arguments: { file_id: 'aaaaaaaaaaaaaaaaaaaaaaaaaa' } });
  } catch (e) {
    throw new Error(`callTool(file_status, unknown id) threw instead of returning isError: code=${e.code} ${e.message}`);
  }
  check(failed.isError === true, 'failing call isError', failed);
  const env = failed.structuredContent;
  check(env && env.status === 'failed', 'envelope status', env);
  check(env.error.code === 'not_found', 'envelope code', env);
  check(typeof env.error.retryable === 'boolean', 'envelope retryable', env);
  check(typeof env.error.recoveryHint === 'string' && env.error.recoveryHint.length > 0, 'envelope recoveryHint', env);
  check(Array.isArray(failed.content) && failed.content[0].type === 'text' && JSON.parse(failed.content[0].text).error.code === 'not_found', 'text mirror of the envelope', failed.content);
  out.failing = env;

  // A failing task tool.
  let bad;
  try {
    bad = await client.callTool({ name: 'task_get', arguments: { task_id: 'aaaaaaaaaaaaaaaaaaaaaaaaaa' } });
  } catch (e) {
    throw new Error(`callTool(task_get, unknown id) threw: code=${e.code} ${e.message}`);
  }
  check(bad.isError === true && bad.structuredContent.error.code === 'not_found', 'task_get unknown id', bad);

  // A job naming an unknown file is refused at the call, with the envelope.
  const refused = await client.callTool({ name: 'archive_files', arguments: { file_ids: ['aaaaaaaaaaaaaaaaaaaaaaaaaa'] } });
  check(refused.isError === true && refused.structuredContent.error.code === 'not_found' && refused.structuredContent.error.recoveryHint.includes('aaaaaaaaaaaaaaaaaaaaaaaaaa'), 'archive_files of an unknown id', refused);
  out.refused = refused.structuredContent;

  // A task that fails, where the server declares [commands.fail] (a program that exits 1; the
  // Rust side says whether it must): its task_get result (task fields + envelope) must fit the
  // schema too.
  if (names.includes('export_fail')) {
    const started = await client.callTool({ name: 'export_fail', arguments: {} });
    check(started.isError !== true && typeof started.structuredContent.task_id === 'string', 'export_fail started', started);
    let task;
    for (let i = 0; i < 300; i++) {
      task = await client.callTool({ name: 'task_get', arguments: { task_id: started.structuredContent.task_id, wait_ms: 2000 } });
      if (!['working', 'input_required'].includes(task.structuredContent.status)) break;
    }
    check(task.isError === true && task.structuredContent.status === 'failed' && task.structuredContent.error.code === 'task_failed', 'failed task envelope', task);
    out.task = task.structuredContent;
  }

  // A succeeding tool: its structuredContent is validated against the outputSchema too.
  const ok = await client.callTool({ name: 'file_upload_begin', arguments: { name: 'ts.txt', size: 3 } });
  check(ok.isError !== true, 'file_upload_begin ok', ok);
  check(ok.structuredContent.status === 'ok' && ok.structuredContent.file.size === 3, 'file_upload_begin result', ok.structuredContent);
  check(typeof ok.structuredContent.upload_url === 'string' && ok.structuredContent.upload_url.includes('scope=upload'), 'signed upload_url', ok.structuredContent);
  const link = ok.content.find((c) => c.type === 'resource_link');
  check(link && link.uri === `ferry://files/${ok.structuredContent.file.id}` && link.size === 3, 'resource_link', ok.content);
  // A failure whose envelope carries partial.cursor: a chunk at the wrong offset.
  let mismatch;
  try {
    mismatch = await client.callTool({ name: 'file_upload_chunk', arguments: { file_id: ok.structuredContent.file.id, offset: 2, data: 'eHl6' } });
  } catch (e) {
    throw new Error(`callTool(file_upload_chunk, wrong offset) threw: code=${e.code} ${e.message}`);
  }
  check(mismatch.isError === true && mismatch.structuredContent.error.code === 'offset_mismatch', 'offset_mismatch envelope', mismatch);
  check(mismatch.structuredContent.error.partial && mismatch.structuredContent.error.partial.cursor === 0, 'partial.cursor', mismatch.structuredContent);
  out.offset = mismatch.structuredContent;
  const status = await client.callTool({ name: 'file_status', arguments: { file_id: ok.structuredContent.file.id } });
  check(status.isError !== true && status.structuredContent.file.complete === false, 'file_status of the new file', status);
  out.ok = ok.structuredContent.file;

  await client.close();
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
