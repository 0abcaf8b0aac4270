// The deployment form: only the chosen loader's options are shown (admin_options.py makes a
// group per loader), and the JSON box only for a loader that has no option fields.
(function () {
  "use strict";
  const loader = document.getElementById("id_loader");
  if (!loader) return;
  const groups = document.querySelectorAll("fieldset.ms-options");
  const json = document.querySelector(".form-row.field-config");

  function choose() {
    let mine = false;
    for (const group of groups) {
      const shown = group.classList.contains("ms-options-" + loader.value);
      group.style.display = shown ? "" : "none";
      mine = mine || shown;
    }
    if (json) json.style.display = mine ? "none" : "";
  }

  loader.addEventListener("change", choose);
  choose();
})();
