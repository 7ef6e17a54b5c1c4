// Resumable uploads with the vendored tus-js-client (window.tus), checksummed as the CLI
// does: a CRC-32 on every chunk, verified by the server as it arrives, and the whole
// file's SHA-256 in the metadata, verified before the file appears at its destination.
// tus-js-client remembers unfinished uploads in localStorage, so after a reload the same
// file picked again continues where the server stopped.
import { headers } from "./api.js";
import { crc32Base64, sha256OfBlob } from "./hash.js";

export const CHUNK_SIZE = 8 * 1024 * 1024;

// The problem document (RFC 9457) a failed tus request answered, or {} if it was none.
export function problemOf(error) {
  try {
    return JSON.parse(error.originalResponse?.getBody?.() || "") || {};
  } catch {
    return {};
  }
}

// tus-js-client retries a 409 like a dropped connection by default, five times over 19 s.
// Here a 409 is an answer, not a hiccup — the file exists, or a folder is in the way — with
// one exception: a mismatched offset, which the retry's HEAD puts right (the tus way).
// Everything else keeps tus-js-client's own rule: retry unless a 4xx other than 423 (busy).
export function shouldRetry(error) {
  const status = error.originalResponse?.getStatus() ?? 0;
  if (status === 409) return problemOf(error).code === "ERR_MISMATCHED_OFFSET";
  const final = status >= 400 && status < 500 && status !== 423;
  return !final && navigator.onLine !== false;
}

// Wraps tus-js-client's HTTP stack to add `Upload-Checksum` to every chunk it sends.
class ChecksummingStack {
  constructor(inner) {
    this.inner = inner;
  }

  getName() {
    return `checksumming ${this.inner.getName()}`;
  }

  createRequest(method, url) {
    const request = this.inner.createRequest(method, url);
    const send = request.send.bind(request);
    request.send = async (body = null) => {
      if (body !== null && method === "PATCH") {
        const data = body instanceof Blob ? await body.arrayBuffer() : body;
        const bytes = data instanceof Uint8Array ? data : new Uint8Array(data.buffer ?? data);
        request.setHeader("Upload-Checksum", `crc32 ${crc32Base64(bytes)}`);
      }
      return send(body);
    };
    return request;
  }
}

// Uploads `file` to the PFS path `dest`. `on` has progress(acknowledged, total),
// hashing(done, total), resumed(offset, total) and status(text); resolves with the server's
// sha256 of the placed file, rejects with the tus error.
export function uploadFile(file, dest, { user, overwrite = false, on }) {
  return new Promise((resolve, reject) => {
    let placedSha = null;
    const metadata = { path: dest };
    if (overwrite) metadata.overwrite = "1";
    const upload = new window.tus.Upload(file, {
      endpoint: `${location.origin}/api/v1/pfs/uploads`,
      chunkSize: CHUNK_SIZE,
      retryDelays: [0, 1000, 3000, 5000, 10000],
      onShouldRetry: shouldRetry,
      headers: headers("POST"),
      metadata,
      // One user, one destination, one file version: never resume someone else's upload
      // or this file's into another folder.
      fingerprint: async () => `paddlecloud:${user}:${dest}:${file.size}:${file.lastModified}`,
      removeFingerprintOnSuccess: true,
      httpStack: new ChecksummingStack(new window.tus.DefaultHttpStack()),
      onChunkComplete: (_size, accepted, total) => on.progress(accepted, total),
      onAfterResponse: (request, response) => {
        placedSha = response.getHeader("PaddleCloud-Sha256") || placedSha;
        // A HEAD is how tus-js-client asks the server where a remembered upload stands.
        if (request.getMethod() === "HEAD" && response.getStatus() === 200) {
          on.resumed(Number(response.getHeader("Upload-Offset")), file.size);
        }
      },
      onSuccess: () => resolve(placedSha),
      onError: (error) => reject(error),
    });
    start(upload, file, metadata, on).catch(reject);
  });
}

async function start(upload, file, metadata, on) {
  const previous = await upload.findPreviousUploads();
  if (previous.length > 0) {
    const last = previous[previous.length - 1];
    // The metadata stored with it (sha256 included) is what a re-created upload sends.
    if (last.metadata) upload.options.metadata = last.metadata;
    upload.resumeFromPreviousUpload(last);
    on.status("resuming…");
  } else {
    on.status("computing its sha256…");
    metadata.sha256 = await sha256OfBlob(file, (done) => on.hashing(done, file.size));
    on.status("uploading…");
  }
  upload.start();
}
