// The globals qjs and upstream's second shim give a snippet (providers.md §3.4): `scriptArgs`
// (qjs -e has no script arguments) and, where Intl.NumberFormat is missing or degenerate
// (QuickJS has none), an en-US Intl.NumberFormat with Number.prototype.toLocaleString on it.
globalThis.scriptArgs = [];
(() => {
  try {
    if (new Intl.NumberFormat('en-US').format(1234.5) === '1,234.5') return;
  } catch (_) {
    // Missing: polyfilled below.
  }
  const symbols = { USD: '$', CAD: 'CA$', AUD: 'A$', EUR: '€', GBP: '£', JPY: '¥', CNY: 'CN¥', INR: '₹' };
  const grouped = (digits) => digits.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const digits = (value, name) => {
    const n = Number(value);
    if (!(n >= 0 && n <= 100)) throw new RangeError(`${name} value is out of range.`);
    return Math.floor(n);
  };
  // `x` (finite, not negative) rounded half away from zero to `places` fraction digits, as
  // [integer digits, fraction digits], from its shortest decimal form (as Intl rounds: 1.005
  // is "1.01", where toFixed gives "1.00"), in plain digits however large.
  const fixed = (x, places) => {
    const [mantissa, exponent = '0'] = String(x).split('e');
    const [whole, part = ''] = mantissa.split('.');
    let all = whole + part;
    let point = whole.length + Number(exponent);
    if (point < 0) {
      all = '0'.repeat(-point) + all;
      point = 0;
    }
    const keep = point + places;
    all = all.padEnd(keep, '0');
    const up = all.length > keep && all[keep] >= '5';
    all = all.slice(0, keep);
    if (up) {
      const carried = all.split('');
      let at = carried.length - 1;
      while (at >= 0 && carried[at] === '9') carried[at--] = '0';
      if (at < 0) {
        carried.unshift('1');
        point += 1;
      } else {
        carried[at] = String(Number(carried[at]) + 1);
      }
      all = carried.join('');
    }
    const int = all.slice(0, point).replace(/^0+(?=\d)/, '') || '0';
    return [int, all.slice(point)];
  };
  function NumberFormat(locales, options) {
    if (!new.target) return new NumberFormat(locales, options);
    const o = options === undefined ? {} : Object(options);
    const style = o.style === undefined ? 'decimal' : String(o.style);
    if (!['decimal', 'currency', 'percent'].includes(style)) throw new RangeError(`Value ${style} out of range for Intl.NumberFormat options property style`);
    const currency = o.currency === undefined ? undefined : String(o.currency).toUpperCase();
    if (style === 'currency' && currency === undefined) throw new TypeError('Currency code is required with currency style.');
    const minDefault = style === 'currency' ? (currency === 'JPY' ? 0 : 2) : 0;
    const maxDefault = style === 'currency' ? minDefault : style === 'percent' ? 0 : 3;
    let min = o.minimumFractionDigits === undefined ? undefined : digits(o.minimumFractionDigits, 'minimumFractionDigits');
    let max = o.maximumFractionDigits === undefined ? undefined : digits(o.maximumFractionDigits, 'maximumFractionDigits');
    if (min === undefined) min = max === undefined ? minDefault : Math.min(minDefault, max);
    if (max === undefined) max = Math.max(min, maxDefault);
    if (max < min) throw new RangeError('maximumFractionDigits value is out of range.');
    Object.defineProperty(this, '__options', {
      value: { style, currency, min, max, grouping: o.useGrouping !== false },
    });
  }
  function format(value) {
    const { style, currency, min, max, grouping } = this.__options;
    let n = Number(value);
    if (Number.isNaN(n)) return 'NaN';
    if (style === 'percent') n *= 100;
    let text = '∞';
    if (Number.isFinite(n)) {
      let [int, frac] = fixed(Math.abs(n), max);
      while (frac.length > min && frac.endsWith('0')) frac = frac.slice(0, -1);
      text = (grouping ? grouped(int) : int) + (frac ? `.${frac}` : '');
    }
    if (style === 'currency') text = (symbols[currency] || `${currency}\u00a0`) + text;
    if (style === 'percent') text += '%';
    return (n < 0 || Object.is(n, -0) ? '-' : '') + text;
  }
  // As in Intl, `format` is a getter answering a function bound to its formatter, so
  // `values.map(nf.format)` works.
  Object.defineProperty(NumberFormat.prototype, 'format', {
    get() {
      if (!Object.prototype.hasOwnProperty.call(this, '__format')) {
        Object.defineProperty(this, '__format', { value: format.bind(this) });
      }
      return this.__format;
    },
    configurable: true,
  });
  NumberFormat.prototype.resolvedOptions = function resolvedOptions() {
    const { style, currency, min, max, grouping } = this.__options;
    const out = { locale: 'en-US', numberingSystem: 'latn', style };
    if (currency !== undefined) out.currency = currency;
    return Object.assign(out, { minimumFractionDigits: min, maximumFractionDigits: max, useGrouping: grouping });
  };
  NumberFormat.supportedLocalesOf = () => ['en-US'];
  const intl = typeof Intl === 'object' && Intl !== null ? Intl : {};
  intl.NumberFormat = NumberFormat;
  globalThis.Intl = intl;
  Object.defineProperty(Number.prototype, 'toLocaleString', {
    value: function toLocaleString(locales, options) {
      return new NumberFormat(locales, options).format(this);
    },
    writable: true,
    configurable: true,
  });
})();
