// Calls to the PaddleCloud API with the session cookie; the CSRF token rides on every
// state-changing request (docs/dashboard.md, "Security").

export const csrfToken = document.body.dataset.csrf || "";
const UNSAFE = new Set(["POST", "PUT", "PATCH", "DELETE"]);

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem.code || "";
    this.problem = problem;
  }
}

export function signIn() {
  const here = location.pathname + location.search;
  location.assign(`/login?next=${encodeURIComponent(here)}`);
}

export function headers(method, extra = {}) {
  const result = { ...extra };
  if (UNSAFE.has(method)) result["X-CSRF-Token"] = csrfToken;
  return result;
}

export async function problemOf(response) {
  try {
    return await response.json();
  } catch {
    return { title: response.statusText };
  }
}

// JSON in, JSON out; a problem+json answer becomes an ApiError, a 401 a trip to sign-in.
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = {
    method,
    headers: headers(method, { Accept: "application/json" }),
    credentials: "same-origin",
    cache: "no-store",
    signal,
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    signIn();
    throw new ApiError(401, { detail: "Your session has ended; sign in again." });
  }
  if (!response.ok) throw new ApiError(response.status, await problemOf(response));
  if (response.status === 204) return null;
  return response.json();
}

export function pfsUrl(endpoint, path, extra = {}) {
  const query = new URLSearchParams({ path, ...extra });
  return `/api/v1/pfs/${endpoint}?${query}`;
}
