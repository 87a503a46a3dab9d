// Every diagram drawn at its own size (mermaid's flowchart.useMaxWidth off): the theme's
// mermaid.initialize call goes through here. Scaled to a phone's width, a diagram's text was
// 5 to 7 pixels high; at its own size its text stays 16 px, and a diagram wider than the page
// scrolls sideways in its own box (stylesheets/extra.css).
(() => {
  const initialize = mermaid.initialize.bind(mermaid);
  mermaid.initialize = (config) =>
    initialize({ ...config, flowchart: { ...(config && config.flowchart), useMaxWidth: false } });
})();
