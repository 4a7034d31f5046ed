// Small line charts on a <canvas>, written for this dashboard (no library, nothing fetched).
// drawLineChart(canvas, series, options): series = [{name, color, points: [[x, y], ...]}].
// After drawing, canvas.dataset.points holds how many data points were drawn (tests read it).
"use strict";

function niceStep(span, ticks) {
  // A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals over `span`.
  const raw = span / Math.max(1, ticks);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const unit = raw / power;
  return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
}

function formatTick(value, step) {
  if (Math.abs(value) >= 1e4) return value.toExponential(1);
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  return value.toFixed(Math.min(decimals, 4));
}

function drawLineChart(canvas, series, options) {
  options = options || {};
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 400;
  const height = canvas.clientHeight || 220;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";

  const points = [];
  for (const s of series) for (const p of s.points) if (Number.isFinite(p[1])) points.push(p);
  canvas.dataset.points = String(points.length);
  if (points.length === 0) {
    ctx.fillStyle = "#6b7483";
    ctx.textAlign = "center";
    ctx.fillText(options.empty || "waiting for data", width / 2, height / 2);
    return;
  }

  const left = 52, right = 12, top = 22, bottom = 26;
  let xMin = Math.min(...points.map((p) => p[0])), xMax = Math.max(...points.map((p) => p[0]));
  let yMin = Math.min(...points.map((p) => p[1])), yMax = Math.max(...points.map((p) => p[1]));
  if (options.yMin !== undefined) yMin = Math.min(yMin, options.yMin);
  if (options.yMax !== undefined) yMax = Math.max(yMax, options.yMax);
  if (xMax === xMin) { xMin -= 1; xMax += 1; }
  if (yMax === yMin) { const pad = Math.abs(yMax) * 0.1 || 1; yMin -= pad; yMax += pad; }
  const yStep = niceStep(yMax - yMin, 4);
  yMin = Math.floor(yMin / yStep) * yStep;
  yMax = Math.ceil(yMax / yStep) * yStep;
  const xStep = Math.max(1, Math.round(niceStep(xMax - xMin, 6)));
  const sx = (x) => left + ((x - xMin) / (xMax - xMin)) * (width - left - right);
  const sy = (y) => height - bottom - ((y - yMin) / (yMax - yMin)) * (height - top - bottom);

  // Grid and axis labels.
  ctx.strokeStyle = "#e1e5eb";
  ctx.fillStyle = "#6b7483";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let y = yMin; y <= yMax + yStep / 2; y += yStep) {
    ctx.beginPath();
    ctx.moveTo(left, Math.round(sy(y)) + 0.5);
    ctx.lineTo(width - right, Math.round(sy(y)) + 0.5);
    ctx.stroke();
    ctx.fillText(formatTick(y, yStep), left - 6, sy(y));
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let x = Math.ceil(xMin / xStep) * xStep; x <= xMax; x += xStep) {
    ctx.fillText(String(x), sx(x), height - bottom + 6);
  }
  if (options.xLabel) {
    ctx.textAlign = "right";
    ctx.fillText(`x: ${options.xLabel}`, width - right, 5);
  }

  // Lines with a dot per point, then the legend.
  let legendX = left;
  for (const s of series) {
    const pts = s.points.filter((p) => Number.isFinite(p[1]));
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach((p, i) => (i ? ctx.lineTo(sx(p[0]), sy(p[1])) : ctx.moveTo(sx(p[0]), sy(p[1]))));
    ctx.stroke();
    for (const p of pts) {
      ctx.beginPath();
      ctx.arc(sx(p[0]), sy(p[1]), 3, 0, 2 * Math.PI);
      ctx.fill();
    }
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = "#1d2430";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.fillText(s.name, legendX + 14, 5);
    legendX += 24 + ctx.measureText(s.name).width;
  }
}
