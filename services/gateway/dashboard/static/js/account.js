// Changing your own password: the gateway checks the current one, ends every other session
// of yours and gives this page a new session cookie, so it goes on signed in.
import { api } from "./api.js";
import { $ } from "./ui.js";

export function start() {
  const form = $("password-form");
  const status = $("password-status");
  const say = (text, error = false) => {
    status.textContent = text;
    status.className = error ? "error" : "";
    status.dataset.state = error ? "failed" : "done";
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const { current, new: fresh, again } = form.elements;
    if (fresh.value !== again.value) {
      say("The two new passwords differ; nothing was changed.", true);
      return;
    }
    try {
      await api("/api/v1/auth/password", {
        method: "PUT",
        body: { current_password: current.value, new_password: fresh.value },
      });
    } catch (error) {
      say(error.message, true);
      return;
    }
    form.reset();
    say("Password changed. Your other sessions have ended; this one goes on.");
  });
}
