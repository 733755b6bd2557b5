// The Copy button beside a secret shown once (templates/_secret_once.html). The Clipboard API exists only where the
// page is a secure context (HTTPS or localhost); over plain HTTP on a LAN, as the appliance is often reached, the
// field's text is selected and copied with execCommand instead. Neither needs a network.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  let copied = false;
  try {
    await navigator.clipboard.writeText(field.value);
    copied = true;
  } catch {
    field.focus();
    field.select();
    copied = document.execCommand("copy");
  }
  const note = button.parentElement.querySelector("[data-copied]");
  note.textContent = copied ? gettext("Copied") : gettext("Selected: press Ctrl+C to copy");
  note.hidden = false;
});
