// AI Factory web chat: mounts a chat button that opens the app's chat in an iframe.
(function () {
  const script = document.currentScript;
  const token = script && script.dataset.token;
  if (!token) { console.error("AI Factory web chat: the script tag needs data-token."); return; }
  const frame = document.createElement("iframe");
  // The page's own origin lets a site that the app does not allow see why instead of "refused to connect".
  frame.src = "{{ widget_url|escapejs }}?token=" + encodeURIComponent(token) + "&site=" + encodeURIComponent(location.origin);
  frame.title = script.dataset.title || "Chat";
  frame.id = "ai-factory-chat-frame";
  frame.style.cssText = "position:fixed;bottom:84px;right:20px;width:380px;height:540px;max-width:calc(100vw - 40px);" +
    "border:1px solid #d0d4dd;border-radius:12px;box-shadow:0 8px 30px rgba(0,0,0,.18);background:#fff;display:none;z-index:2147483646";
  const button = document.createElement("button");
  button.type = "button";
  button.id = "ai-factory-chat-button";
  button.textContent = script.dataset.label || "Chat";
  button.setAttribute("aria-expanded", "false");
  button.style.cssText = "position:fixed;bottom:20px;right:20px;padding:12px 18px;border-radius:999px;border:none;" +
    "background:#3b5bdb;color:#fff;font:600 15px system-ui,sans-serif;cursor:pointer;z-index:2147483647";
  button.addEventListener("click", () => {
    const open = frame.style.display === "none";
    frame.style.display = open ? "block" : "none";
    button.setAttribute("aria-expanded", String(open));
  });
  const mount = () => document.body.append(frame, button);
  if (document.body) mount(); else document.addEventListener("DOMContentLoaded", mount);
})();
