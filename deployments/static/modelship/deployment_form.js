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

  // A stored model picked in the model box: its format's loader and use, where the form
  // has none yet (an operator's choice stands).
  const model = document.getElementById("id_model");
  const usecase = document.getElementById("id_usecase");
  const stored = document.getElementById("ms-stored-models");
  if (model && stored) {
    model.addEventListener("change", function () {
      const option = Array.from(stored.options).find((o) => o.value === model.value);
      if (!option) return;
      if (!loader.value && option.dataset.loader) {
        loader.value = option.dataset.loader;
        choose();
      }
      if (usecase && option.dataset.usecase && !usecase.dataset.touched) {
        usecase.value = option.dataset.usecase;
      }
    });
    if (usecase) usecase.addEventListener("change", () => (usecase.dataset.touched = "1"));
  }
})();
