-- hub_http: the Hub client's requests (hub.lua is the rest): one request
-- with its redirects (the token only to the endpoint's host), bounded by
-- hub.limits (metadata answers by the metadata limits), and a refusal (401,
-- 403, 404) in words.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local http = {}

function http.quote_url(s, keep_slash)
  return (s:gsub('[^%w%-%._~' .. (keep_slash and '/' or '') .. ']', function(c) return ('%%%02X'):format(c:byte()) end))
end

function http.host_of(url) return url:match('^(%a[%w+.-]*://[^/]+)') end

function http.headers_for(url, session)
  local h = {'Accept-Encoding: identity', 'User-Agent: anatomy/' .. torch.version.anatomy}
  -- the token goes to the endpoint only, never to a host a redirect names
  if session.token and http.host_of(url) == http.host_of(session.endpoint) then
    h[#h + 1] = 'Authorization: Bearer ' .. session.token
  end
  return h
end

function http.reach_error(session, url, r)
  local hint = ''
  if not session.offline then
    hint = '; with the files already in the cache, HF_HUB_OFFLINE=1 uses them without asking the Hub'
  end
  return ('cannot reach %s (%s)%s'):format(url, r.error, hint)
end

function http.login_hint(session)
  return ('log in with `hf auth login` (or `huggingface-cli login`), or set HF_TOKEN%s'):format(
    session.token_source and (' (sent: ' .. session.token_source .. ')') or '')
end

-- An answer's refusal in words: 401 (no or a bad token), 403 (no access), 404.
function http.refusal(session, r, what)
  local code = r.headers['x-error-code']
  if r.status == 401 then
    if session.token then
      return ('%s: the Hub refused the token from %s (401 Unauthorized): it is not valid for %s; %s'):format(
        what, session.token_source, session.repo_id, http.login_hint({}))
    end
    return ("%s: the Hub answered 401 Unauthorized: '%s' is gated or private (or does not exist), and no token was sent; %s"):format(
      what, session.repo_id, http.login_hint({}))
  elseif r.status == 403 then
    return ("%s: the token from %s has no access to '%s' (403 Forbidden): a gated model needs its terms accepted on %s/%s"):format(
      what, session.token_source or '(none)', session.repo_id, session.endpoint, session.repo_id)
  elseif r.status == 404 then
    if code == 'RevisionNotFound' then
      return ("%s: '%s' has no revision '%s' (404)"):format(what, session.repo_id, session.revision)
    elseif code == 'EntryNotFound' then
      return ("%s: '%s' at revision '%s' has no such file (404)"):format(what, session.repo_id, session.revision)
    end
    local message = r.body and r.body:match('"error"%s*:%s*"([^"]*)"') or ''
    if code == 'RepositoryNotFound' or (code == nil and session.revision == 'main' and message == '') then
      return ("%s: no repository '%s' on %s (404)"):format(what, session.repo_id, session.endpoint)
    end
    if message:match('^Invalid rev') or message:lower():find('revision', 1, true) then
      return ("%s: '%s' has no revision '%s' (404: %s)"):format(what, session.repo_id, session.revision, message)
    end
    -- a 404 that does not say what is missing: name both, claim neither
    return ("%s: the Hub answered 404 for '%s' at revision '%s' without saying whether the repository or the revision is "
      .. "missing%s"):format(what, session.repo_id, session.revision, message ~= '' and (' (' .. message .. ')') or '')
  end
  local message = r.body and r.body:match('"error"%s*:%s*"([^"]*)"') or ''
  return ('%s: the Hub answered %d%s'):format(what, r.status, message ~= '' and (' (' .. message .. ')') or '')
end

-- Where a redirect's Location points, from the URL that answered: an
-- absolute URL as it is, '//host/path' with the answering scheme, '/path' on
-- the answering host, anything else beside the answering path.
function http.resolve_location(url, location)
  if location:match('^%a[%w+.-]*://') then return location end
  if location:sub(1, 2) == '//' then return url:match('^(%a[%w+.-]*:)') .. location end
  if location:sub(1, 1) == '/' then return http.host_of(url) .. location end
  local base = url:match('^([^?#]*)'):match('^(.*/)') or (url .. '/')
  return base .. location
end

-- One request; redirects on the same host (a renamed repository) are
-- followed, and with req.follow those to other hosts too (a download's
-- storage hosts); otherwise one to another host (the CDN an LFS file is on)
-- is returned to the caller, its location made absolute. The token goes with
-- each hop only when it is to the endpoint (headers_for). Without
-- req.output the answer is metadata: bounded by the metadata limits.
function http.request(session, req)
  local follow = req.follow
  req.follow = nil
  local limits = session.limits
  if not req.output then
    req.stall_timeout = req.stall_timeout or limits.metadata_stall
    req.max_seconds = req.max_seconds or limits.metadata_seconds
    req.max_bytes = req.max_bytes or limits.max_json_bytes
  end
  for _ = 1, 6 do
    req.headers = http.headers_for(req.url, session)
    local r = native.http(req)
    local location = r.headers.location
    if r.status >= 300 and r.status < 400 and location then
      location = http.resolve_location(req.url, location)
      r.headers.location = location
    end
    if r.status >= 300 and r.status < 400 and location and (http.host_of(location) == http.host_of(req.url) or follow) then
      req.url = location
    else
      r.url = req.url
      if r.too_large and not req.output then
        r.error = ('the answer is larger than %d bytes, more than a listing can be'):format(req.max_bytes)
      elseif r.too_slow and not req.output then
        r.error = ('the answer did not come whole within %g s (ANATOMY_HUB_METADATA_TIMEOUT)'):format(req.max_seconds)
      end
      return r
    end
  end
  error(('%s: too many redirects from %s'):format(session.where, req.url), 0)
end

function http.normalize_etag(e)
  if not e then return nil end
  return (e:gsub('^W/', ''):gsub('^"(.*)"$', '%1'))
end

return http
